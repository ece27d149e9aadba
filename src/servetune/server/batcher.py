"""Dynamic batching for one model: wait for the first request, then collect up to ``batch_size``
requests within ``max_delay`` of that request's arrival (not of the moment a worker asked, as
TorchServe does: pytorch/serve#2478), or sooner when a controller says the oldest request would miss its deadline
(``dispatch_by``). Idle workers take turns collecting; the queue is bounded. A queued job whose deadline passes is
answered at the deadline (a timer per job that has one), not when a worker next asks for a batch.

A batch that is due the moment its last request arrives (full, or no delay) while a worker waits idle for one goes
to that worker from the arrival itself (``next_batch(direct=...)``): the request's bytes are read, queued and sent to
the worker in one turn of the loop, not in the next turn when the waiting worker's task resumes.

A worker a controller holds in reserve (``next_batch(reserve=...)``) does not collect: it takes the queue's oldest
requests only once they have waited past the controller's ``reserve_by`` (else ``dispatch_by``) and no other worker
took them first, so that a worker kept for bursts does not split the steady load into smaller batches.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from servetune._exceptions import ApiError, ServetuneError
from servetune.api.types import InferRequest, InferResult

log = logging.getLogger("servetune.batcher")


@dataclass(slots=True)
class Job:
    """One inference request waiting for, or running in, a batch; its answer arrives on ``future``."""

    request: InferRequest
    future: asyncio.Future[InferResult]
    attempts: int = 0

    @property
    def arrival(self) -> float:
        return self.request.arrival

    @property
    def solo(self) -> bool:
        """Runs in a batch of its own (a describe request, a stream: see ``InferRequest.solo``)."""
        return self.request.solo

    def answer(self, result: InferResult) -> None:
        """Set the result. The request's ``on_answer`` (one of the future's done callbacks) runs now, in this turn of
        the loop, rather than in the next one as the future's callbacks do; the others as usual."""
        future, now = self.future, self.request.on_answer
        if now is None or not future.remove_done_callback(now):
            future.set_result(result)
            return
        future.set_result(result)
        try:
            now(future)
        except Exception:  # as the loop reports a callback's failure
            log.exception("an answer's callback failed")

    @property
    def abandoned(self) -> bool:
        """Answered already, or nobody waits for the answer: the client went away or its deadline passed."""
        request = self.request
        gone, deadline = request.is_disconnected, request.deadline
        return (
            self.future.done()
            or (gone is not None and gone())
            or (deadline is not None and time.monotonic() >= deadline)
        )


class QueueFull(ServetuneError):
    """The model's job queue is at capacity (internal: the served model answers ``ApiError.queue_full``)."""


class Batcher:
    def __init__(self, batch_size: int, max_delay_s: float, capacity: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s must be >= 0, got {max_delay_s}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self.capacity = capacity
        self._queue: collections.deque[Job] = collections.deque()
        self._arrived = asyncio.Event()
        self._collecting = asyncio.Lock()
        self._reserve_wake = asyncio.Event()  # an arrival that makes a batch due sooner, or a change of the reserve
        # when each worker waiting in reserve looks next (inf: only when woken); kept only while it waits: a look
        # that has passed must not stand for the next (an arrival due sooner than it would wake nobody)
        self._reserve_looks: list[float] = []
        self.dropped_disconnected = 0
        # A controller's (``servetune.control``): given the first request's arrival and the requests queued, the
        # latest time the batch may go for its oldest request to make its deadline; None: the delay alone decides.
        self.dispatch_by: Callable[[float, int], float] | None = None
        # the same, for a worker held in reserve (None: ``dispatch_by``)
        self.reserve_by: Callable[[float, int], float] | None = None
        self.last_reason = "delay"  # why the last batch went: "full", "delay", "deadline", "solo" or "reserve"
        # the collecting worker's, while it waits (``next_batch``): sends a batch at once, True if it did
        self._direct: Callable[[list[Job]], bool] | None = None
        self._handed: list[Job] | None = None  # the batch ``_direct`` sent, for the collector to return

    def reconfigure(self, batch_size: int, max_delay_s: float) -> None:
        """New limits, used from the batch being collected on (a collector waiting for more re-checks now)."""
        if batch_size < 1 or max_delay_s < 0:
            raise ValueError(f"batch_size must be >= 1 and max_delay_s >= 0, got {batch_size}, {max_delay_s}")
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self._arrived.set()
        self.wake_reserve()

    def wake_reserve(self) -> None:
        """Which workers are held in reserve changed (or what is due when): those waiting as reserve look again."""
        self._reserve_wake.set()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def remaining_capacity(self) -> int:
        return max(0, self.capacity - len(self._queue))

    def put(self, job: Job) -> None:
        if len(self._queue) >= self.capacity:
            raise QueueFull
        self._queue.append(job)
        self._expire_at_deadline(job)
        if self._direct is not None:
            self._send_direct()
        self._arrived.set()
        looks = self._reserve_looks
        if looks:  # a larger batch takes longer: its oldest request may have to go sooner
            head = self._queue[0]
            by = self.reserve_by or self.dispatch_by
            if head.solo or by is None or by(head.arrival, len(self._queue)) < min(looks):
                self.wake_reserve()  # only when due sooner than they will look: not at every arrival

    def _send_direct(self) -> None:
        """Hand the batch to the waiting collector's worker now if it is due (see the module)."""
        queue = self._queue
        if self.dispatch_by is not None or queue[0].solo:
            return
        if len(queue) < self.batch_size and self.max_delay_s > 0:
            return
        batch = self._take()
        if not batch:
            return
        direct, self._direct = self._direct, None
        sent = False
        try:
            sent = direct is not None and direct(batch)
        finally:
            if sent:  # (``last_reason`` is a controller's, and the batcher sends nothing this way under one)
                self._handed = batch
            else:  # not sent (the worker went, its slot is retiring): the collector takes it as usual
                queue.extendleft(reversed(batch))

    def put_front(self, jobs: list[Job]) -> None:
        """Return jobs to the head of the queue (a retry after a worker died), ignoring capacity."""
        self._queue.extendleft(reversed(jobs))
        for job in jobs:
            self._expire_at_deadline(job)
        self._arrived.set()
        self.wake_reserve()  # older requests at the head: due sooner

    def _expire_at_deadline(self, job: Job) -> None:
        """A job with a deadline leaves the queue at that deadline (504 to a client still waiting): the workers may
        all be busy long past it, and the client should not wait for one of them to ask for a batch to learn it."""
        deadline = job.request.deadline
        if deadline is None or job.future.done():
            return
        # call_later: the deadline is on time.monotonic(), whatever clock the loop keeps (uvloop's is its own); the
        # timer goes when the job is answered, so that it does not hold the job (and its body) to a distant deadline
        timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), self._expire, job)
        job.future.add_done_callback(lambda _: timer.cancel())

    def _expire(self, job: Job) -> None:
        if job.future.done():  # answered (or cancelled) already: the usual case, nothing to look for
            return
        for i, queued in enumerate(self._queue):  # only jobs still waiting or running at their deadline get here
            if queued is job:
                del self._queue[i]
                self._discard(job)
                return

    def drain(self) -> list[Job]:
        jobs = list(self._queue)
        self._queue.clear()
        return jobs

    async def _wait_arrival(self, timeout: float | None) -> bool:
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _discard(self, job: Job) -> None:
        """Drop an abandoned job: the client went away (nobody to answer), or its deadline passed (a client still
        waiting, e.g. a REST client's ``x-servetune-timeout-ms``, gets 504 at once instead of a late answer)."""
        if not job.future.done():
            gone = job.request.is_disconnected
            if gone is not None and gone():
                job.future.cancel()
            else:
                job.future.set_exception(ApiError.timeout("the request's deadline passed while it waited in the queue"))
        self.dropped_disconnected += 1

    def _prune(self) -> None:
        while self._queue and self._queue[0].abandoned:
            self._discard(self._queue.popleft())

    def _take(self) -> list[Job]:
        """Up to ``batch_size`` jobs from the head of the queue (not past a solo one), the abandoned dropped."""
        batch: list[Job] = []
        while self._queue and len(batch) < self.batch_size and not self._queue[0].solo:
            job = self._queue.popleft()
            if job.abandoned:
                self._discard(job)
                continue
            batch.append(job)
        return batch

    def take_ready(self) -> list[Job]:
        """The next batch if one is due now and no worker waits to collect it: full (``batch_size`` jobs queued) or
        its oldest job past the delay; else []. For a worker that can take more than one batch at once (light
        models, ``WorkerPool``): never with a controller's deadlines, a solo job at the head, or an idle worker."""
        if self.dispatch_by is not None or self._collecting.locked():
            return []
        self._prune()
        queue = self._queue
        if not queue or queue[0].solo:
            return []
        if len(queue) < self.batch_size and time.monotonic() < queue[0].arrival + self.max_delay_s:
            return []
        return self._take()  # (``last_reason`` is a controller's, and there is none here)

    async def next_batch(
        self, reserve: Callable[[], bool] | None = None, direct: Callable[[list[Job]], bool] | None = None
    ) -> list[Job]:
        """Wait for and return the next batch (1..batch_size jobs). Cancel-safe: no job is lost. ``reserve``: while
        it returns True (and a controller gives deadlines), the caller is a worker held in reserve (see the module).
        ``direct``: sends a batch to the caller's worker at once from an arrival that makes it due (see the module),
        True if it did, and then the caller's wait can no longer be cancelled; that batch is returned."""
        while reserve is not None and self.dispatch_by is not None and reserve():
            batch = await self._reserve_batch(reserve)
            if batch:
                return batch
        async with self._collecting:
            self._direct = direct
            try:
                return await self._collect()
            finally:
                self._direct = None

    async def _collect(self) -> list[Job]:
        while True:
            self._prune()
            while not self._queue:
                await self._wait_arrival(None)
                if (handed := self._take_handed()) is not None:
                    return handed
                self._prune()
            if self._queue[0].solo:
                self.last_reason = "solo"
                return [self._queue.popleft()]
            first = self._queue[0].arrival
            self.last_reason = "full"
            while len(self._queue) < self.batch_size:
                # re-read each time: a reconfigure (a controller's) applies to the batch being collected
                deadline = first + self.max_delay_s
                reason = "delay"
                if self.dispatch_by is not None:
                    latest = self.dispatch_by(first, len(self._queue))
                    if latest < deadline:
                        deadline, reason = latest, "deadline"
                remaining = deadline - time.monotonic()
                arrived = remaining > 0 and await self._wait_arrival(remaining)
                if (handed := self._take_handed()) is not None:
                    return handed
                if not arrived:
                    self.last_reason = reason
                    break
            batch = self._take()
            if batch:
                return batch

    def _take_handed(self) -> list[Job] | None:
        handed, self._handed = self._handed, None
        return handed

    async def _reserve_batch(self, reserve: Callable[[], bool]) -> list[Job]:
        """A reserve worker's wait: the oldest requests once they have waited past ``reserve_by`` (reason
        ``reserve``), or [] once the worker is no longer held in reserve."""
        while reserve() and self.dispatch_by is not None:
            self._prune()
            timeout: float | None = None
            until = math.inf
            if self._queue and not self._queue[0].solo:
                by = self.reserve_by or self.dispatch_by
                until = by(self._queue[0].arrival, len(self._queue))
                due = until - time.monotonic()
                if due <= 0:
                    batch = self._take()
                    if batch:
                        self.last_reason = "reserve"
                        return batch
                    continue
                timeout = due if math.isfinite(due) else None
            self._reserve_wake.clear()
            self._reserve_looks.append(until)
            try:
                await asyncio.wait_for(self._reserve_wake.wait(), timeout)
            except TimeoutError:
                pass
            finally:
                self._reserve_looks.remove(until)
        return []
