"""Load engines behind one name -> "module:attr" registry, and the small contract they share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from servetune.bench.payload import Payload
from servetune.bench.progress import Progress
from servetune.bench.recording import Recording
from servetune.bench.spec import BenchSpec
from servetune.registry import registered

ENGINES: dict[str, str] = {
    "async": "servetune.bench.async_engine:AsyncEngine",
    "ab": "servetune.bench.ab_engine:ApacheBenchEngine",
    "grpc": "servetune.bench.grpc_engine:GrpcEngine",
    "oip-json": "servetune.bench.oip:OipJsonEngine",
    "oip-binary": "servetune.bench.oip:OipBinaryEngine",
}


async def _nothing() -> None:
    return None


@dataclass
class RunHooks:
    """Called by an engine: ``measure_start`` once the warm-up is over, just before the first measured request
    (and not awaited in the open loop's schedule), ``measure_end`` after the last measured answer.

    ``enough`` lets a caller end the measured part early (the built-in engine only): once ``min_seconds`` of it have
    run, about twice a second, it is given the recording so far and the seconds measured, and returns True when the
    figures are tight enough to decide on (the tuner's early stop). Keep it cheap: it runs on the client's loop."""

    measure_start: Callable[[], Awaitable[None]] = _nothing
    measure_end: Callable[[], Awaitable[None]] = _nothing
    progress: Progress = field(default_factory=Progress)
    enough: Callable[[Recording, float], bool] | None = None
    min_seconds: float = 0.0


class Engine(Protocol):
    """A way to put load on a URL. ``run`` records the measured requests; it computes no statistics."""

    name: str

    async def run(self, spec: BenchSpec, payloads: Sequence[Payload], hooks: RunHooks) -> Recording: ...


def get_engine(name: str) -> Engine:
    """The engine registered under ``name``."""
    engine: Engine = registered(ENGINES, name, f"engine={name!r}: expected one of {', '.join(sorted(ENGINES))}")()
    return engine
