"""Interference: how much of the machine other processes used while a run was measured.

A run on a shared machine (a CI runner, a laptop, a busy Kubernetes node) measures the server *and* whatever else
ran meanwhile. The sampler reads the machine's CPU counters (``/proc/stat`` through psutil: user, system, irq, and
steal time where the kernel reports it) at the start and the end of the measured part, and the CPU of the processes
it can name: the load client (this process) and the server (the processes listening on the target's port, or the
ones the caller gives, each with its children). What processes used beyond those two is *others*: CPU that neither
the client nor the server used. Interrupt time (irq, softirq) is counted on its own: the kernel charges it to no
process, and on a run's loopback traffic it is mostly the run's own (0.04-0.08 cores at 4,000 req/s of a no-op
model, against a threshold of 0.15, counted as others before). Steal is CPU time the hypervisor gave to other guests
while this one wanted to run.

A run is **contended** when others used at least ``threshold_cores`` (default 0.25 of a core), or steal did: its
figures then describe the machine's neighbours as much as the server, and the tuner measures it again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

# Other processes' CPU (cores, mean over a run) from which a run is contended. On the project's idle 2-core VM no
# tuner run measured more than 0.07; a hog on one core for 1 s of a 5 s run averages 0.2 and took a P99 from
# ~160 to 354 ms (the tail is where a stall lands), so 0.25 let such runs decide (docs/tune.md).
CONTENDED_CORES = 0.15


@dataclass(frozen=True)
class HostUsage:
    """CPU use over one measured run, in cores (CPU seconds per second of the run)."""

    cores: int
    wall_s: float
    busy_cores: float  # every process on the machine (excluding steal)
    client_cores: float  # this process: the load generator (and, in the tuner, the tuner itself)
    server_cores: float | None  # the server's processes, when they are known
    others_cores: float  # processes' CPU that is neither's: the machine's other tenants
    steal_cores: float | None  # None where the kernel does not report steal time
    threshold_cores: float = CONTENDED_CORES
    irq_cores: float = 0.0  # interrupts (irq + softirq): charged to no process, mostly the run's own network traffic

    @property
    def contended(self) -> bool:
        return self.others_cores >= self.threshold_cores or (self.steal_cores or 0.0) >= self.threshold_cores

    def describe(self) -> str:
        server = f", server {self.server_cores:.2f}" if self.server_cores is not None else ""
        steal = f", steal {self.steal_cores:.2f}" if self.steal_cores else ""
        mark = " (contended)" if self.contended else ""
        irq = f", interrupts {self.irq_cores:.2f}" if self.irq_cores >= 0.005 else ""
        return f"others {self.others_cores:.2f} cores{steal}{mark}; client {self.client_cores:.2f}{server}{irq}"


def _busy_irq_steal() -> tuple[float, float, float | None]:
    """Processes' CPU (user, nice, system), interrupts' (irq, softirq) and steal, in seconds since boot."""
    times = psutil.cpu_times()
    # On Linux guest time is already in user (and guest_nice in nice): not added twice.
    busy = sum(getattr(times, name, 0.0) for name in ("user", "nice", "system"))
    irq = sum(getattr(times, name, 0.0) for name in ("irq", "softirq"))
    return busy, irq, getattr(times, "steal", None)


def _tree(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes and their descendants (a scan of every process on the machine: slow on a busy one)."""
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in family:
            found.setdefault(proc.pid, proc)
    return list(found.values())


def _tree_cpu(procs: Iterable[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            total += process_cpu_s(proc.cpu_times())
        except psutil.Error:
            continue
    return total


def process_cpu_s(times: object) -> float:
    """User + system time of a process and of its children it has waited for (a worker that exited and was reaped
    during the run keeps its CPU counted)."""
    names = ("user", "system", "children_user", "children_system")
    return float(sum(getattr(times, name, 0.0) for name in names))


def listeners(url: str) -> tuple[int, ...]:
    """The processes listening on ``url``'s port when it is on this machine (loopback); () when unknown."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return ()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return ()
    found = {
        c.pid for c in connections if c.pid and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    }
    found.discard(os.getpid())
    return tuple(sorted(found))


class HostSampler:
    """``start()`` before the measured part, ``stop()`` after it: the :class:`HostUsage` between the two.

    The server's process tree is found when the sampler is made (before the run: finding children scans every
    process on the machine, tens of milliseconds on a busy one, which must not stall the load's event loop as its
    measured part begins), and again at ``stop()`` so that a worker started meanwhile is counted."""

    def __init__(self, server_pids: Iterable[int] = (), threshold_cores: float = CONTENDED_CORES) -> None:
        self.server_pids = tuple(server_pids)
        self.threshold_cores = threshold_cores
        self._procs = _tree(self.server_pids) if self.server_pids else []
        self._own = psutil.Process()
        self._start: tuple[float, float, float, float | None, float, float] | None = None

    def _sample(self, procs: list[psutil.Process]) -> tuple[float, float, float, float | None, float, float]:
        busy, irq, steal = _busy_irq_steal()
        server = _tree_cpu(procs) if self.server_pids else 0.0
        return time.perf_counter(), busy, irq, steal, process_cpu_s(self._own.cpu_times()), server

    def start(self) -> None:
        self._start = self._sample(self._procs)

    def stop(self) -> HostUsage | None:
        if self._start is None:
            return None
        t0, busy0, irq0, steal0, own0, server0 = self._start
        t1, busy1, irq1, steal1, own1, server1 = self._sample(_tree(self.server_pids) if self.server_pids else [])
        wall = t1 - t0
        if wall <= 0:
            return None
        busy, irq, own = (busy1 - busy0) / wall, (irq1 - irq0) / wall, (own1 - own0) / wall
        server = (server1 - server0) / wall if self.server_pids else None
        steal = (steal1 - steal0) / wall if steal0 is not None and steal1 is not None else None
        others = max(0.0, busy - own - (server or 0.0))
        return HostUsage(psutil.cpu_count() or 1, round(wall, 3), round(busy + irq, 3), round(own, 3),
                         None if server is None else round(server, 3), round(others, 3),
                         None if steal is None else round(steal, 3), self.threshold_cores, round(irq, 3))  # fmt: skip
