"""How long a process has been starting: its age since exec, read from /proc, for the start-up breakdown that
``servetune serve --log-level debug`` logs (interpreter, imports, archive extraction, worker spawn, model load).

Neutral: the CLI, the API server, the native backend and the worker process all ask.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("servetune.startup")

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_age_s(pid: int | None = None) -> float | None:
    """Seconds since the process was created (exec'd, for a fresh interpreter), to the clock tick (10 ms); None
    where /proc does not tell."""
    try:
        with open(f"/proc/{pid or 'self'}/stat", "rb") as fh:
            stat = fh.read()
        with open("/proc/uptime", "rb") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
    started = int(fields[19]) / _CLOCK_TICKS  # field 22 (starttime), counted from field 3
    return max(0.0, uptime - started)


class StartupClock:
    """Marks phases of one process's start-up; ``since_exec`` is what the process's own age says at a mark."""

    def __init__(self) -> None:
        age = process_age_s()
        self._t0 = time.perf_counter() - (age or 0.0)  # perf_counter at the process's exec, as well as /proc says
        self._last = time.perf_counter()
        #: exec to this clock: the interpreter's own start (and whatever ran before the clock's module was imported)
        self.interpreter_ms = (age or 0.0) * 1000.0

    def since_exec_ms(self) -> float:
        return (time.perf_counter() - self._t0) * 1000.0

    def lap_ms(self) -> float:
        """Milliseconds since the previous lap (or since this clock was made)."""
        now = time.perf_counter()
        lap, self._last = (now - self._last) * 1000.0, now
        return lap


#: this process's clock, made when the servetune package is first imported (its __init__ imports this module first)
CLOCK = StartupClock()


def freeze_heap(collect: bool) -> float:
    """Move every object this process holds to the garbage collector's permanent generation (``collect``: after a
    full collection, so that what start-up left as garbage is not kept): a full collection while serving then visits
    only what was made since. Without it a full collection visits the whole start-up heap, every so often, with
    everything else in the process stopped: a frontend's (~56k objects) took 40-48 ms every ~50 s at ~200 req/s here,
    a late answer for every request in flight; a process that imported torch and torchvision (~334k objects), 134 ms.
    Returns the milliseconds it took (a collection's; the freeze itself is a list splice)."""
    started = time.perf_counter()
    if collect:
        gc.collect()
    gc.freeze()
    return (time.perf_counter() - started) * 1000.0


_frozen_lock = threading.Lock()
_frozen_depth = 0
_frozen_here = False  # the freeze is this block's to undo (not a process that froze its heap for good)


@contextmanager
def heap_frozen() -> Iterator[None]:
    """The heap frozen while the block runs (a load generator's: a full collection of its heap mid-run would be
    measured as the server's latency), back to the collector's care after the last such block (nested and
    concurrent blocks share one freeze)."""
    global _frozen_depth, _frozen_here
    with _frozen_lock:
        _frozen_depth += 1
        if _frozen_depth == 1:
            _frozen_here = gc.get_freeze_count() == 0
            gc.freeze()
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen_depth -= 1
            if _frozen_depth == 0 and _frozen_here:
                gc.unfreeze()


__all__ = ["CLOCK", "StartupClock", "freeze_heap", "heap_frozen", "log", "process_age_s"]
