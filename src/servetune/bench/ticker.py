"""Calling back at precise times: the open loop's clock.

asyncio's timers have a resolution of one millisecond (the selector's ``epoll_wait`` timeout, libuv's clock under
uvloop): a send due 0.3 ms from now wakes up to 1 ms late, and at 2,000 req/s (a send every 0.5 ms) the schedule
slips by about a send. On Linux the :class:`Pacer` arms a ``timerfd`` (CLOCK_MONOTONIC, the clock of
``time.perf_counter``) at the absolute due time and lets the loop watch it like a socket: the kernel's
high-resolution timer wakes ``epoll_wait`` within tens of microseconds, whatever the loop's own timers do, and
nothing spins. The due work runs right in the reader's callback (no future, no task switch per wake-up: the open
loop pays for its clock in microseconds per send), and re-arming the timer makes the descriptor unreadable again,
so it is never read. Elsewhere (or if the timerfd cannot be made) it falls back to the loop's own timers until a
millisecond before the due time, then to yielding until it is reached.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import sys
import time
from collections.abc import Callable

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

# fire(now) does what is due at ``now`` and returns when it is next called (a time.perf_counter value), or None
Fire = Callable[[float], "float | None"]


class Pacer:
    """``await pacer.run(first, fire)`` calls ``fire(now)`` once ``time.perf_counter() >= first``, then again at
    each time ``fire`` returns, until it returns None. Between calls the loop runs everything else (a call whose next
    time has already come is made on the loop's next iteration, so the work it started gets to run first)."""

    def __init__(self) -> None:
        self.fd = -1
        self.precise = False
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)
        if _LIBC is not None and time.get_clock_info("perf_counter").implementation.endswith("(CLOCK_MONOTONIC)"):
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self.fd, self.precise = fd, True

    async def run(self, first: float, fire: Fire) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        clock = time.perf_counter

        def call() -> None:
            if done.done():
                return
            try:
                following = fire(clock())
            except BaseException as exc:  # surfaces in the caller's await
                done.set_exception(exc)
                return
            if following is None:
                done.set_result(None)
            else:
                schedule(following)

        def schedule(when: float) -> None:
            # One trigger pending at a time: the armed timer, or a call soon (with the timer disarmed, so that a
            # descriptor left readable by its last expiry does not call back a second time).
            now = clock()
            if when <= now:
                if self.precise:
                    self._arm(0.0)
                loop.call_soon(call)
            elif self.precise and self._arm(when):
                pass  # the reader calls back when the timer fires
            elif when - now > _FALLBACK_MARGIN_S:
                loop.call_later(when - now - _FALLBACK_MARGIN_S, schedule, when)
            else:
                loop.call_soon(schedule, when)

        if self.precise:
            loop.add_reader(self.fd, call)
        try:
            schedule(first)
            await done
        finally:
            if self.precise:
                loop.remove_reader(self.fd)
                self._arm(0.0)  # disarmed

    def _arm(self, when: float) -> bool:
        """Set the timer to fire at ``when`` (0: disarm); False when that failed."""
        frac, whole = math.modf(when)
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = int(whole), int(frac * 1e9)
        return _LIBC is not None and _LIBC.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, self._ref, None) == 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.precise = False
