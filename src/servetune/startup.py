"""How long a process has been starting: its age since exec, read from /proc, for the start-up breakdown that
``servetune serve --log-level debug`` logs (interpreter, imports, archive extraction, worker spawn, model load).

Neutral: the CLI, the API server, the native backend and the worker process all ask.
"""

from __future__ import annotations

import logging
import os
import time

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

__all__ = ["CLOCK", "StartupClock", "log", "process_age_s"]
