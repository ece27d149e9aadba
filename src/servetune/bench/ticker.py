"""Waking the event loop at a precise time: the open loop's clock.

asyncio's timers have a resolution of one millisecond (the selector's ``epoll_wait`` timeout, libuv's clock under
uvloop): a send due 0.3 ms from now wakes up to 1 ms late, and at 2,000 req/s (a send every 0.5 ms) the schedule
slips by about a send. On Linux the ticker arms a ``timerfd`` (CLOCK_MONOTONIC, the clock of
``time.perf_counter``) at the absolute due time and lets the loop watch it like a socket: the kernel's
high-resolution timer wakes ``epoll_wait`` within tens of microseconds, whatever the loop's own timers do, and
nothing spins. Elsewhere (or if the timerfd cannot be made) it falls back to sleeping until a millisecond before the
due time, then yielding to the loop until it is reached.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import struct
import sys
import time

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
_FALLBACK_MARGIN_S = 0.0015


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


class Ticker:
    """``await ticker.until(t)`` returns at ``time.perf_counter() >= t`` (to within tens of µs on Linux).

    One waiter at a time (the open loop's scheduler). ``close()`` releases the timer."""

    def __init__(self) -> None:
        self.fd = -1
        self.precise = False
        self._waiter: asyncio.Future[None] | None = None
        self._spec = _Itimerspec()
        self._loop: asyncio.AbstractEventLoop | None = None
        if _LIBC is not None and time.get_clock_info("perf_counter").implementation.endswith("(CLOCK_MONOTONIC)"):
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self.fd, self.precise = fd, True

    async def until(self, when: float) -> None:
        if when <= time.perf_counter():
            return
        if not self.precise:
            await self._fallback(when)
            return
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                self._loop.remove_reader(self.fd)
            loop.add_reader(self.fd, self._fired)
            self._loop = loop
        frac, whole = math.modf(when)
        self._spec.it_value.tv_sec = int(whole)
        self._spec.it_value.tv_nsec = int(frac * 1e9)
        if _LIBC is None or _LIBC.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            await self._fallback(when)
            return
        self._waiter = loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _fired(self) -> None:
        try:
            struct.unpack("Q", os.read(self.fd, 8))
        except BlockingIOError:
            return  # a stale wake-up: the timer was re-armed since
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @staticmethod
    async def _fallback(when: float) -> None:
        clock = time.perf_counter
        ahead = when - clock() - _FALLBACK_MARGIN_S
        if ahead > 0:
            await asyncio.sleep(ahead)
        while clock() < when:
            await asyncio.sleep(0)

    def close(self) -> None:
        if self.fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
            self.precise = False
