"""The worker pool of one served model: worker slots that take batches from the model's batcher, run them on their
worker process, supervise it (restart with backoff, crash-loop detection) and scale in and out.

A batch always gets answered: one result per request from the worker, or one error each (504 when the worker timed
out and is replaced, 503 when it died, broke the one-result-per-request invariant, or the frontend failed) — a slot
never leaves a request waiting, and keeps serving after any of these (``answers.py``).

A slot waiting for a batch lends the batcher a way to send one to its worker at once (``_send_direct``): a batch due
on its last request's arrival goes from that arrival, and the slot's task only reads its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servetune._exceptions import ApiError, ParentUnavailable, WorkerDied, WorkerError, WorkerTimeout
from servetune.api.types import WorkerStatus
from servetune.server.answers import Answers, Delivery, fail
from servetune.server.batcher import Job
from servetune.server.messages import Message, Predict
from servetune.server.parent import Forking
from servetune.server.process import WorkerProcess

if TYPE_CHECKING:
    from servetune.control import Controller
    from servetune.server.model import ServedModel

log = logging.getLogger("servetune.pool")

RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
# A light model (its batches' handler time, averaged, under LIGHT_MS) gets the batches already due sent to its worker
# together, up to MAX_SENT_AT_ONCE in one write: for a no-op, the frontend's cost of a batch's round trip (~100 µs) is
# most of a request's (benchmarks/noop_latency.py).
LIGHT_MS = 1.0
MAX_SENT_AT_ONCE = 8
HEALTHY_AFTER_S = 60.0  # a worker that ran this long resets its slot's crash count
FIRST_WORKER_ID = 9000  # TorchServe numbers its workers from 9000


@dataclass(slots=True)
class _Sent:
    """A batch written to its worker, its answer not yet read."""

    batch: list[Job]
    started: float
    pending: asyncio.Future[Message]
    delivery: Delivery | None
    reason: str
    predicted_ms: float


@dataclass
class WorkerSlot:
    """A place for one worker; it keeps its crash history across restarts."""

    slot_id: int
    worker: WorkerProcess | None = None
    task: asyncio.Task[None] | None = None
    busy: bool = False
    waiting: bool = False  # waiting for the next batch (its worker's exit cancels the wait)
    exit_cancel: bool = False  # the slot's task was cancelled by its worker's exit, not to retire it
    retiring: bool = False
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # retired: its worker stopped, the slot dropped
    crashes: int = 0
    last_error: str = ""
    status: str = "STARTING"
    # a batch the batcher sent from its last request's arrival (``WorkerPool._send_direct``), for the task to finish
    sent: _Sent | None = None
    # The CPU settings of its batches: (placement generation, position, threads, cores), asked of the placement
    # only when the host's demands or the slot's position change, not on every batch.
    cpu: tuple[int, int, int, tuple[int, ...]] | None = None

    @property
    def worker_id(self) -> str:
        return str(FIRST_WORKER_ID + self.slot_id)


class WorkerPool:
    def __init__(self, model: ServedModel, observe_batch: Callable[[int], None] | None = None) -> None:
        self.model = model
        self.answers = Answers(model, observe_batch)
        self._slots: list[WorkerSlot] = []
        self._next_slot = 0
        self._lock = asyncio.Lock()
        self._starting: set[WorkerProcess] = set()  # workers loading their model (killed by ``close``)
        self.reserve = 0  # the newest this many workers are held in reserve (a controller's; the batcher's module)
        control = model.control  # an online controller that moves the workers wants them started in milliseconds
        scales = control is not None and control.workers is not None and control.workers[0] < control.workers[1]
        self.forking = Forking(model.name, model.plan.worker_preload, model.model_dir, model.plan.manifest, scales)
        self.closed = False

    # ---- state -------------------------------------------------------------------------------

    @property
    def ready(self) -> int:
        return sum(1 for s in self._slots if s.status == "READY" and not s.retiring)

    @property
    def active(self) -> list[WorkerSlot]:
        return [s for s in self._slots if not s.retiring]

    @property
    def serving(self) -> bool:
        """Some worker serves, or is (re)starting: requests may queue. False when none is, or every one is crashed."""
        return any(s.status != "CRASHED" for s in self.active)

    @property
    def crash_loop(self) -> bool:
        """A worker slot failed three or more times in a row and has not come back yet."""
        return any(s.crashes >= 3 and s.status != "READY" for s in self._slots)

    @property
    def busy(self) -> bool:
        return any(s.busy for s in self._slots)

    def set_reserve(self, workers: int) -> None:
        """Hold the newest ``workers`` workers in reserve (always leaving one that collects batches)."""
        self.reserve = max(0, workers)
        self.model.batcher.wake_reserve()

    def _in_reserve(self, slot: WorkerSlot) -> bool:
        if not self.reserve:
            return False
        active = self.active
        return slot in active and active.index(slot) >= max(1, len(active) - self.reserve)

    def position(self, slot: WorkerSlot) -> int:
        """The slot's place among the active ones (its cores follow it)."""
        active = self.active
        return active.index(slot) if slot in active else len(active)

    # ---- running batches ---------------------------------------------------------------------

    def _cpu(self, slot: WorkerSlot) -> tuple[int, int, int, tuple[int, ...]]:
        """(placement generation, position, threads, cores) for the slot's next batch, asked anew only when the
        placement or the slot's position changed."""
        model = self.model
        cpu, position, generation = slot.cpu, self.position(slot), model.placement.generation
        if cpu is None or cpu[0] != generation or cpu[1] != position:
            placement, key = model.placement, model.key
            cpu = slot.cpu = (generation, position, placement.threads(key), placement.cores(key, position))
        return cpu

    async def _dispatch(self, slot: WorkerSlot, worker: WorkerProcess, batch: list[Job]) -> None:
        model = self.model
        sent, slot.sent = slot.sent, None
        if sent is None and self.answers.handler_ms < LIGHT_MS and model.controller is None and not batch[0].solo:
            more: list[list[Job]] = []
            while len(more) < MAX_SENT_AT_ONCE - 1 and (ready := model.batcher.take_ready()):
                more.append(ready)
            if more:
                await self._dispatch_several(slot, worker, [batch, *more])
                return
        controller = model.controller
        actual_ms = math.nan
        try:
            if sent is None:
                sent = self._send(slot, worker, batch)
            await worker.drain()
            result = await worker.result(sent.pending, float(model.plan.response_timeout_s))
            actual_ms = (time.monotonic() - sent.started) * 1000.0
        except (WorkerTimeout, WorkerDied) as exc:
            self.answers.failed(batch, worker, exc)
            raise
        finally:
            worker.on_partial = None
            if controller is not None and sent is not None:  # a failed batch teaches the fit nothing (NaN)
                _finished(controller, worker, batch, sent.started, sent.reason, sent.predicted_ms, actual_ms)
        if sent.delivery is None or not sent.delivery.done:
            self.answers.deliver(batch, result, sent.started, worker)

    def _send(self, slot: WorkerSlot, worker: WorkerProcess, batch: list[Job]) -> _Sent:
        """Write the batch to the worker (WorkerDied if it is gone); its answer is read by ``_dispatch``."""
        model = self.model
        started = time.monotonic()
        for job in batch:
            job.attempts += 1
        cpu = self._cpu(slot)
        predict = Predict([j.request for j in batch], model.plan.config.batch_size, cpu[2], cpu[3])
        # only a stream gets intermediate answers, and a stream runs alone (``InferRequest.solo``)
        worker.on_partial = self.answers.partials(batch, worker.worker_id) if batch[0].solo else None
        controller = model.controller
        # why the batcher let it go: set by the ``next_batch`` that formed it (no await came in between)
        reason, predicted_ms = model.batcher.last_reason, math.nan
        if controller is not None:
            predicted_ms = controller.dispatched(worker.worker_id, len(batch))
        # without a controller (which times the batch first), answered from the read callback (``Delivery``)
        delivery = None if controller is not None else Delivery(self.answers, batch, started, worker)
        try:
            (pending,) = worker.send_now([predict], [delivery])
        except WorkerDied:
            if controller is not None:  # counted as a failed batch
                _finished(controller, worker, batch, started, reason, predicted_ms, math.nan)
            raise
        return _Sent(batch, started, pending, delivery, reason, predicted_ms)

    def _send_direct(self, slot: WorkerSlot, worker: WorkerProcess, batch: list[Job]) -> bool:
        """The batcher's ``direct`` for the slot while it waits for a batch: send ``batch`` now, unless the slot's wait
        is ending (its worker gone, the slot retiring or cancelled); True if sent. From then on the slot is busy, so
        that nothing cancels its wait: its task takes the batch's answer (``_dispatch``)."""
        task = slot.task  # (never under a controller: the batcher does not ask while it gives deadlines)
        if not slot.waiting or slot.retiring or self.closed or not worker.alive or task is None or task.cancelling():
            return False
        try:
            slot.sent = self._send(slot, worker, batch)
        except WorkerDied:
            for job in batch:
                job.attempts -= 1
            return False
        slot.waiting = False
        slot.busy = True
        return True

    async def _dispatch_several(self, slot: WorkerSlot, worker: WorkerProcess, batches: list[list[Job]]) -> None:
        """Batches of a light model that were all due, sent to the worker in one write; each answered as its result
        comes (the worker runs them in turn). When the worker times out or dies on one, that batch fails as a single
        batch would, and the batches after it, which it had not started, go back to the head of the queue (all of
        them when the write itself failed: none reached the worker)."""
        model = self.model
        started = time.monotonic()
        jobs = [job for batch in batches for job in batch]
        for job in jobs:
            job.attempts += 1
        cpu = self._cpu(slot)
        size, timeout = model.plan.config.batch_size, float(model.plan.response_timeout_s)
        worker.on_partial = None  # no stream among them: a stream runs alone
        done = 0  # batches answered or failed; those after them go back to the queue
        try:
            sent = await worker.send([Predict([j.request for j in b], size, cpu[2], cpu[3]) for b in batches])
            for batch, pending in zip(batches, sent, strict=True):
                done += 1  # answered or failed below, not queued again
                try:
                    result = await worker.result(pending, timeout)
                except (WorkerTimeout, WorkerDied) as exc:
                    self.answers.failed(batch, worker, exc)
                    raise
                self.answers.deliver(batch, result, started, worker)
        finally:
            worker.on_partial = None
            unstarted = [job for batch in batches[done:] for job in batch if not job.future.done()]
            if unstarted:
                for job in unstarted:
                    job.attempts -= 1
                model.batcher.put_front(unstarted)

    # ---- supervision -------------------------------------------------------------------------

    async def _start_worker(self, slot: WorkerSlot) -> WorkerProcess:
        model = self.model
        placement, key = model.placement, model.key
        threads = placement.threads(key)
        spec = model.plan.worker_spec(
            model.model_dir,
            gpu_id=placement.gpu(model.plan, slot.slot_id),
            num_threads=threads,
            cpu_cores=placement.cores(key, self.position(slot)),
        )
        env, timeout = placement.environment(threads), float(model.plan.startup_timeout_s)
        slot.status = "STARTING"
        parent = await self.forking.parent_for(spec, env, timeout)
        while True:
            self._check_open()
            worker = WorkerProcess(slot.worker_id, spec, env, parent)
            self._starting.add(worker)
            try:
                await worker.start(timeout)
                return worker
            except ParentUnavailable as exc:  # raised before any process existed: spawn this one instead
                await self.forking.lost(parent, exc)
                parent = None
            finally:
                self._starting.discard(worker)

    async def _slot_loop(self, slot: WorkerSlot, first: WorkerProcess | None) -> None:
        """Run batches on this slot's worker; on a crash, restart with backoff until retired."""
        worker = first
        while not slot.retiring and not self.closed:
            if worker is None:
                delay = RESTART_BACKOFF_S[min(max(slot.crashes - 1, 0), len(RESTART_BACKOFF_S) - 1)]
                if delay:
                    await asyncio.sleep(delay)
                if slot.retiring or self.closed:
                    return
                try:
                    worker = await self._start_worker(slot)
                except (WorkerError, OSError) as exc:
                    slot.crashes += 1
                    slot.last_error = str(exc)
                    slot.status = "CRASHED"
                    log.error("model %s: worker restart failed (%d in a row): %s", self.model.name, slot.crashes, exc)
                    continue
            slot.worker = worker
            slot.status = "READY"
            worker.on_exit = lambda: self._exited(slot)
            if not worker.alive:  # it died before the callback was in place
                worker.on_exit()
            started = time.monotonic()
            served = 0
            try:
                while not slot.retiring and not self.closed:
                    batch = await self._next_batch(slot, worker)
                    if batch is None:
                        break
                    slot.busy = True
                    try:
                        await self._dispatch(slot, worker, batch)
                        served += 1
                    except WorkerError:
                        raise
                    except Exception as exc:  # a bug of ours must not leave the batch's requests waiting
                        log.exception("model %s: batch failed in the frontend", self.model.name)
                        fail(batch, ApiError.unavailable(f"Batch failed in the frontend: {exc!r}"))
                    finally:
                        slot.busy = False
            except WorkerError as exc:
                slot.last_error = str(exc)
            if slot.retiring or self.closed:
                return
            # The worker is gone (or was killed for a timeout): count it and start another.
            worker.kill()
            await worker.wait_exit(5.0)
            if served or time.monotonic() - started > HEALTHY_AFTER_S:
                slot.crashes = 0  # it worked before it died: a fault, not a crash loop
            slot.crashes += 1
            slot.status = "RESTARTING"
            log.error("model %s: worker %s (pid %s) exited; restarting", self.model.name, worker.worker_id, worker.pid)
            slot.worker = None
            worker = None

    async def _next_batch(self, slot: WorkerSlot, worker: WorkerProcess) -> list[Job] | None:
        """The next batch, or None as soon as the worker process exits while the slot waits for one: its exit
        cancels the wait (``_exited``), so that no task is made per batch to watch it. Cancel-safe: the batcher loses
        no job when its wait is cancelled."""
        if not worker.alive:
            return None
        slot.waiting = True
        try:
            batch = await self.model.batcher.next_batch(
                lambda: self._in_reserve(slot), lambda jobs: self._send_direct(slot, worker, jobs)
            )
        except asyncio.CancelledError:
            if not slot.exit_cancel or slot.retiring or self.closed:
                raise
            slot.exit_cancel = False
            task = asyncio.current_task()
            # This cancellation is handled: the slot goes on (to restart its worker), unless someone else cancelled
            # the slot in the same instant (a shutdown): that one is not swallowed.
            if task is not None and task.uncancel() > 0:
                raise
            return None
        finally:
            slot.waiting = False
        if not worker.alive and slot.sent is None:
            self.model.batcher.put_front(batch)  # died in the same instant: give the jobs back (unless sent)
            return None
        return batch

    def _exited(self, slot: WorkerSlot) -> None:
        """The slot's worker process is gone: wake the slot if it is waiting for a batch."""
        if slot.waiting and slot.task is not None and not slot.task.done():
            slot.exit_cancel = True
            slot.task.cancel()

    # ---- scaling -----------------------------------------------------------------------------

    async def scale(self, workers: int) -> None:
        """Start or retire workers until ``workers`` serve; raises WorkerError if a new one cannot start, ApiError 404
        if the model is closed (unregistered) before or while its workers start. Scales run one at a time; ``close``
        does not wait for one (an unregister is not held up by workers loading), so a scale checks for it."""
        async with self._lock:
            self._check_open()
            active = self.active
            if len(active) < workers:
                new_slots = [self._new_slot() for _ in range(workers - len(active))]
                self._slots.extend(new_slots)  # placed now: their positions give them their cores
                results = await asyncio.gather(*(self._start_worker(s) for s in new_slots), return_exceptions=True)
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors or self.closed:
                    for slot, r in zip(new_slots, results, strict=True):
                        self._drop(slot)
                        if isinstance(r, WorkerProcess):
                            await r.stop()
                    self._check_open()
                    raise errors[0]
                for slot, worker in zip(new_slots, results, strict=True):
                    assert isinstance(worker, WorkerProcess)
                    slot.worker = worker
                    slot.status = "READY"
                    slot.task = asyncio.create_task(
                        self._slot_loop(slot, worker), name=f"{self.model.name}-{slot.slot_id}"
                    )
            elif len(active) > workers:
                # Retire idle workers first, the newest first (the oldest are warm and keep their ids); a busy one
                # finishes its batch before it stops.
                victims = sorted(active, key=lambda s: (s.busy, -s.slot_id))[: len(active) - workers]
                await asyncio.gather(*(self._retire(s) for s in victims))
            if self.reserve:  # which workers are the newest changed
                self.model.batcher.wake_reserve()
            if not self.active:
                # No worker left: a request queued before the last one retired would wait for one that never comes
                # (503 at once, as one sent now gets from ``ServedModel.submit``).
                fail(self.model.batcher.drain(), ApiError.no_worker(self.model.name))
                await self.forking.close()  # the parent's memory goes too; the next scale starts one

    async def restart(self) -> None:
        """Replace every worker, one at a time, so that the model keeps serving (settings read at start changed)."""
        for slot in list(self.active):
            async with self._lock:
                self._check_open()
                if slot.retiring:  # a scale retired it meanwhile
                    continue
                fresh = self._new_slot()
                self._slots.append(fresh)
                try:
                    worker = await self._start_worker(fresh)
                except BaseException:
                    self._drop(fresh)
                    raise
                if self.closed:
                    self._drop(fresh)
                    await worker.stop()
                    self._check_open()
                fresh.worker, fresh.status = worker, "READY"
                fresh.task = asyncio.create_task(
                    self._slot_loop(fresh, worker), name=f"{self.model.name}-{fresh.slot_id}"
                )
                await self._retire(slot)

    def _new_slot(self) -> WorkerSlot:
        slot = WorkerSlot(self._next_slot)
        self._next_slot += 1
        return slot

    def _check_open(self) -> None:
        if self.closed:
            model = self.model
            raise ApiError.model_not_found(model.name, f"Model {model.name} version {model.version} was unregistered")

    def _drop(self, slot: WorkerSlot) -> None:
        """Forget a slot (once: a scale that failed and a ``close`` may both drop a starting slot)."""
        if slot in self._slots:
            self._slots.remove(slot)
        slot.gone.set()

    async def _retire(self, slot: WorkerSlot) -> None:
        """Stop the slot's worker (after its batch, if it runs one) and drop the slot; if another caller is retiring
        it already, wait for that."""
        if slot.retiring:
            await slot.gone.wait()
            return
        slot.retiring = True
        slot.status = "UNLOADING"
        try:
            if slot.task is not None:
                if not slot.busy:
                    slot.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await slot.task
            if slot.worker is not None:
                await slot.worker.stop()
        finally:
            self._drop(slot)

    async def close(self) -> None:
        """Stop every worker and refuse further scaling; a scale in progress stops the workers it started."""
        self.closed = True
        for worker in list(self._starting):
            worker.kill()  # its start fails at once; the scale that waits for it finds the pool closed
        await asyncio.gather(*(self._retire(s) for s in list(self._slots)))
        await self.forking.close(final=True)

    # ---- describe ----------------------------------------------------------------------------

    def handler_metadata(self) -> dict[str, Any] | None:
        """The handler's OIP metadata as a ready worker reported it when it loaded (None: no worker is ready, or the
        handler declares none)."""
        for slot in self.active:
            if slot.status == "READY" and slot.worker is not None:
                return slot.worker.metadata
        return None

    def statuses(self) -> list[WorkerStatus]:
        out = []
        for slot in self._slots:
            w = slot.worker
            cpu = w.cpu if w is not None else None
            rss, pss = w.memory() if w is not None else (0, None)
            out.append(
                WorkerStatus(
                    id=w.worker_id if w is not None else slot.worker_id,
                    status=slot.status,
                    start_time=w.start_time if w is not None else 0.0,
                    pid=w.pid if w is not None and w.pid else -1,
                    memory_bytes=rss,
                    pss_bytes=pss,
                    gpu_id=w.gpu_id if w is not None else None,
                    gpu_memory_bytes=w.gpu_memory_bytes if w is not None else 0,
                    restarts=slot.crashes,
                    last_error=slot.last_error,
                    num_threads=cpu.num_threads if cpu is not None else None,
                    inter_op_threads=cpu.inter_op_threads if cpu is not None else None,
                    cpu_cores=cpu.cpu_cores if cpu is not None else None,
                )
            )
        return out


def _finished(
    controller: Controller,
    worker: WorkerProcess,
    batch: list[Job],
    started: float,
    reason: str,
    predicted_ms: float,
    actual_ms: float,
) -> None:
    """Tell the controller a batch it was told of is answered (``actual_ms``) or failed (NaN), with its oldest
    request's time in the queue."""
    oldest_ms = (started - min(j.arrival for j in batch)) * 1000.0
    controller.finished(worker.worker_id, len(batch), reason, oldest_ms, predicted_ms, actual_ms)


__all__ = ["FIRST_WORKER_ID", "WorkerPool", "WorkerSlot"]
