"""A worker's malloc: the memory of one batch kept for the next while batches keep coming, given back once it idles.

A model's forward allocates its activations afresh for every batch: resnet18's first convolution alone writes 26 MB
for a batch of eight. glibc's malloc serves such blocks with ``mmap`` and unmaps them on ``free`` (its threshold
moves up as large blocks are freed, but only to 32 MB, and the heap's top is trimmed past 128 KB free), so every
batch faulted its activations back in, page by page, each zeroed by the kernel.

The tuning (:meth:`BatchMemory.tuned`, glibc only; elsewhere nothing changes): no ``mmap`` for blocks of any size
(``M_MMAP_MAX`` 0: they come from the heap, and a freed one is reused by the next batch), and no trimming of the
heap's top on ``free`` short of 2 GB (``M_TRIM_THRESHOLD``). A busy worker then holds the most its batches needed at
once (resnet18, batch 8: ~50-60 MB more per worker). Once no batch has run for :data:`IDLE_S` (and none is running),
a thread of the worker gives the free pages back (``malloc_trim(0)``: the heap's top, and whole free pages inside it):
an idle model costs what it did before, and a worker whose batches come a second or more apart pays the faults as
before. A thread, not a wait with a timeout on the worker's socket: the worker's loop then blocks in one ``recv`` per
frame, as it did before this tuning; a ``poll`` before each read (the first way this was done) cost a no-op model
~19 us of its ~373 us round trip at concurrency 1 with a blocking client on a 2-core VM (benchmarks/noop_latency.py,
6 interleaved pairs: P50 373 -> 354 us, pairs 0.924-0.991x).

Measured on resnet18 served as ``benchmarks/vs_peers.py`` serves it (2 workers, batches of 8, c=16, 10 s runs, a
2-core VM): before, 1,168-1,620 page faults and 2.0-3.3 ms of system CPU per request, 40.8-42.4 ms of CPU per request
in all, 46.6-48.4 req/s (two runs); after, 0.7-12 faults, 0.04-0.08 ms of system CPU, 38.4-39.1 ms in all, 50.3-51.4
req/s (two runs), with the servers' PSS 848-855 MB where it was 746-812.
"""

from __future__ import annotations

import ctypes
import platform
import threading
import time

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
IDLE_S = 1.0  # no batch for this long: the free pages go back to the system
TRIM_AT = 2**31 - 1  # the largest trim threshold mallopt takes (an int): 2 GB free at the heap's top


class BatchMemory:
    """glibc's malloc tuned for batches (see the module): the worker calls :meth:`batch_started` and
    :meth:`batch_ran` around each batch; a thread started at the first batch gives the free pages back once the worker
    idles."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._trim = libc.malloc_trim
        self.holding = False  # a batch ran since the pages were last given back
        self._busy = False  # a batch is running: its pages are in use
        self._last = 0.0  # when the last batch ended (time.monotonic)
        self._held = threading.Event()  # set while ``holding``: the thread waits on it while nothing is held
        self._watch: threading.Thread | None = None

    @classmethod
    def tuned(cls) -> BatchMemory | None:
        """Tune this process's malloc; None (nothing changed) where the C library is not glibc or refuses."""
        if platform.libc_ver()[0] != "glibc":
            return None
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            libc.mallopt.restype = ctypes.c_int
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
            libc.malloc_trim.restype = ctypes.c_int
        except (OSError, AttributeError):
            return None
        if not libc.mallopt(M_MMAP_MAX, 0) or not libc.mallopt(M_TRIM_THRESHOLD, TRIM_AT):
            return None
        return cls(libc)

    def batch_started(self) -> None:
        self._busy = True

    def batch_ran(self) -> None:
        self._last = time.monotonic()
        self._busy = False
        if not self.holding:
            self.holding = True
            self._held.set()
            if self._watch is None:
                self._watch = threading.Thread(target=self._give_back_at_idle, name="batch-memory", daemon=True)
                self._watch.start()

    def _give_back_at_idle(self) -> None:
        while True:
            self._held.wait()
            due = self._last + IDLE_S - time.monotonic()
            if due > 0 or self._busy:  # a batch ended within IDLE_S, or one is running: look again when it may not
                time.sleep(due if due > 0 else IDLE_S)
                continue
            # cleared before ``holding`` goes: a batch that ends in between finds ``holding`` still set and leaves
            # the event alone, and the next one sets both again
            self._held.clear()
            self.holding = False
            # the free pages back (ctypes lets the GIL go meanwhile; a batch that starts now waits in malloc for the
            # trim's lock, as it would have behind a trim on its own thread)
            self._trim(0)


__all__ = ["IDLE_S", "BatchMemory"]
