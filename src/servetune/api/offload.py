"""Decoding and encoding that is too heavy for the event loop, run on a thread.

Every API (REST, gRPC, inference, management, metrics) shares one event loop: a 6 MB tensor decoded element by
element on it stalled every other client's ``/ping`` for a second and a half. Work on a request whose payload is
larger than :data:`OFF_LOOP_BYTES` runs on the loop's default thread pool (:func:`off_loop`); smaller payloads are
decoded in place, where a thread hop would cost more than the work. Python threads share the GIL, but a thread gives
it up every few milliseconds (``sys.getswitchinterval``), so the loop keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

OFF_LOOP_BYTES = 64 * 1024

P = ParamSpec("P")
R = TypeVar("R")


async def off_loop(size: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)``: on a thread when ``size`` (the payload's bytes) is over :data:`OFF_LOOP_BYTES`."""
    if size <= OFF_LOOP_BYTES:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


__all__ = ["OFF_LOOP_BYTES", "off_loop"]
