"""A served model version: its batcher, its worker processes, their supervision and scaling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servetune.config.model import ModelConfig
from servetune.server.batcher import Batcher, Job, JobResult, QueueFull
from servetune.server.process import WorkerDied, WorkerLoadError, WorkerProcess, WorkerTimeout

log = logging.getLogger("servetune.model")

RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
HEALTHY_AFTER_S = 60.0  # a worker that ran this long resets its slot's crash count


class NoWorker(Exception):
    """The model has no worker to serve a request."""


def error_body(code: int, type_: str, message: str) -> bytes:
    return json.dumps({"code": code, "type": type_, "message": message}, indent=2).encode()


def error_result(code: int, type_: str, message: str) -> JobResult:
    return JobResult(code, error_body(code, type_, message), "application/json", {})


@dataclass
class WorkerSlot:
    """A place for one worker; it keeps its crash history across restarts."""

    slot_id: int
    worker: WorkerProcess | None = None
    task: asyncio.Task[None] | None = None
    busy: bool = False
    retiring: bool = False
    crashes: int = 0
    last_error: str = ""
    status: str = "STARTING"


@dataclass
class ModelSpec:
    """What is needed to start workers for a model version."""

    name: str
    version: str
    url: str
    model_dir: Path
    manifest: dict[str, Any]
    config: ModelConfig
    loaded_at_startup: bool = False
    extras: dict[str, Any] = field(default_factory=dict)


class ServedModel:
    """One model version: accepts jobs into its batcher and keeps ``target_workers`` workers serving them."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        job_queue_size: int,
        response_timeout_s: float,
        startup_timeout_s: float,
        worker_env: Callable[[ServedModel], tuple[int, dict[str, str]]],
        assign_gpu: Callable[[ModelConfig, int], int | None],
        on_batch: Callable[[ServedModel, int], None] | None = None,
        retry_on_worker_death: bool = False,
        worker_threads: Callable[[ServedModel], int] | None = None,
    ) -> None:
        self.spec = spec
        self.config = spec.config
        self.response_timeout_s = response_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.batcher = Batcher(spec.config.batch_size, spec.config.max_batch_delay_ms / 1000.0, job_queue_size)
        self._worker_env = worker_env
        self._assign_gpu = assign_gpu
        self._on_batch = on_batch
        self._worker_threads = worker_threads
        self._retry = retry_on_worker_death
        self._slots: list[WorkerSlot] = []
        self._next_slot = 0
        self._scale_lock = asyncio.Lock()
        self.min_workers = 0
        self.max_workers = 0
        self.accepting = True
        self.closed = False

    # ---- state -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def ready_workers(self) -> int:
        return sum(1 for s in self._slots if s.status == "READY" and not s.retiring)

    @property
    def slots(self) -> list[WorkerSlot]:
        return list(self._slots)

    @property
    def crash_loop(self) -> bool:
        """A worker slot failed three or more times in a row and has not come back yet."""
        return any(s.crashes >= 3 and s.status != "READY" for s in self._slots)

    def healthy(self) -> bool:
        return self.ready_workers >= self.min_workers and not self.crash_loop

    def rebatch(self, batch_size: int | None, max_batch_delay_ms: int | None) -> None:
        """Change the batch size and/or delay in place: the batcher uses them for the next batch it forms, and the
        workers' context (``system_properties["batch_size"]``) follows with that batch. No worker restarts."""
        if batch_size is not None:
            self.config = replace(self.config, batch_size=batch_size)
        if max_batch_delay_ms is not None:
            self.config = replace(self.config, max_batch_delay_ms=max_batch_delay_ms)
        self.spec.config = self.config  # a restarted worker loads with the new values too
        self.batcher.reconfigure(self.config.batch_size, self.config.max_batch_delay_ms / 1000.0)

    # ---- requests ----------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue a job; raises NoWorker or QueueFull at once rather than letting the request hang."""
        if not self.accepting:
            raise NoWorker("Server is shutting down")
        # Queue while a worker (re)starts; refuse at once when there is none, or every one is failing to start.
        if not any(s.status != "CRASHED" and not s.retiring for s in self._slots):
            raise NoWorker
        self.batcher.put(job)

    async def _dispatch(self, slot: WorkerSlot, worker: WorkerProcess, batch: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        items: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for job in batch:
            job.attempts += 1
            items.append(
                {
                    "id": job.request_id,
                    "headers": job.headers,
                    "inputs": [{"name": n, "ctype": c} for n, c, _ in job.inputs],
                }
            )
            blobs.extend(d for _, _, d in job.inputs)
        try:
            frame: dict[str, Any] = {"type": "predict", "batch": items, "batch_size": self.config.batch_size}
            if self._worker_threads is not None:  # workers follow scaling: 1 worker x 2 threads -> 2 x 1 on 2 cores
                frame["num_threads"] = self._worker_threads(self)
            header, bodies = await worker.run(frame, blobs, self.response_timeout_s)
        except WorkerTimeout as exc:
            log.error("model %s: %s; replacing the worker", self.name, exc)
            worker.kill()
            timeout_message = str(exc)
            self._finish(batch, started, None, lambda: error_result(504, "RequestTimeoutException", timeout_message))
            raise
        except WorkerDied as exc:
            retry = [j for j in batch if self._retry and j.attempts < 2 and not j.abandoned]
            if retry:
                self.batcher.put_front(retry)
            failed = [j for j in batch if j not in retry]
            message = f"Worker died while running this request: {exc}"
            self._finish(failed, started, None, lambda: error_result(503, "ServiceUnavailableException", message))
            raise
        handler_ms = float(header.get("handler_ms", 0.0))
        worker.gpu_memory_bytes = int(header.get("gpu_memory") or 0)
        for job, item, body in zip(batch, header["items"], bodies, strict=True):
            result = JobResult(
                status=int(item["status"]),
                body=body,
                content_type=item.get("ctype"),
                headers=item.get("headers") or {},
                queue_ms=(started - job.arrival) * 1000.0,
                handler_ms=handler_ms,
                batch_size=len(batch),
                worker_id=worker.worker_id,
            )
            if not job.future.done():
                job.future.set_result(result)
        if self._on_batch is not None:
            self._on_batch(self, len(batch))

    def _finish(self, jobs: list[Job], started: float, _: None, make: Callable[[], JobResult]) -> None:
        for job in jobs:
            if not job.future.done():
                result = make()
                result.queue_ms = (started - job.arrival) * 1000.0
                result.batch_size = len(jobs)
                job.future.set_result(result)

    # ---- workers -----------------------------------------------------------------------------

    async def _start_worker(self, slot: WorkerSlot) -> WorkerProcess:
        gpu_id = self._assign_gpu(self.config, slot.slot_id)
        worker_id = f"{9000 + slot.slot_id}"
        threads, env = self._worker_env(self)
        spec = {
            "model_name": self.name,
            "model_dir": str(self.spec.model_dir),
            "manifest": self.spec.manifest,
            "gpu_id": gpu_id,
            "batch_size": self.config.batch_size,
            "model_yaml_config": dict(self.config.handler_config),
            "num_threads": threads,
            "limit_max_image_pixels": self.spec.extras.get("limit_max_image_pixels", True),
            "decode_input_request": self.spec.extras.get("decode_input_request", True),
        }
        worker = WorkerProcess(worker_id, spec, env)
        slot.status = "STARTING"
        await worker.start(self.startup_timeout_s)
        return worker

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
                except (WorkerLoadError, WorkerTimeout, WorkerDied, OSError) as exc:
                    slot.crashes += 1
                    slot.last_error = str(exc)
                    slot.status = "CRASHED"
                    log.error("model %s: worker restart failed (%d in a row): %s", self.name, slot.crashes, exc)
                    continue
            slot.worker = worker
            slot.status = "READY"
            started = time.monotonic()
            served = 0
            try:
                while not slot.retiring and not self.closed:
                    batch = await self._next_batch_or_exit(worker)
                    if batch is None:
                        break
                    slot.busy = True
                    try:
                        await self._dispatch(slot, worker, batch)
                        served += 1
                    finally:
                        slot.busy = False
            except (WorkerDied, WorkerTimeout) as exc:
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
            log.error("model %s: worker %s (pid %s) exited; restarting", self.name, worker.worker_id, worker.pid)
            slot.worker = None
            worker = None

    async def _next_batch_or_exit(self, worker: WorkerProcess) -> list[Job] | None:
        """The next batch, or None as soon as the worker process exits while idle."""
        batch_task = asyncio.ensure_future(self.batcher.next_batch())
        exit_task = asyncio.ensure_future(worker.exited.wait())
        try:
            done, _ = await asyncio.wait({batch_task, exit_task}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Retired while waiting: make sure a batch collected in the same instant goes back to the queue.
            batch_task.cancel()
            try:
                collected = await batch_task
            except asyncio.CancelledError:
                pass
            else:
                self.batcher.put_front(collected)
            raise
        finally:
            exit_task.cancel()
        if batch_task in done:
            batch = batch_task.result()
            if worker.alive:
                return batch
            self.batcher.put_front(batch)  # died in the same instant: give the jobs back
            return None
        batch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await batch_task
        return None

    async def scale(self, min_workers: int, max_workers: int | None = None) -> None:
        """Start or retire workers until ``min_workers`` serve; raises WorkerLoadError if a new one cannot load."""
        async with self._scale_lock:
            self.min_workers = min_workers
            self.max_workers = max(min_workers, max_workers if max_workers is not None else min_workers)
            active = [s for s in self._slots if not s.retiring]
            if len(active) < min_workers:
                new_slots = []
                for _ in range(min_workers - len(active)):
                    new_slots.append(WorkerSlot(self._next_slot))
                    self._next_slot += 1
                results = await asyncio.gather(*(self._start_worker(s) for s in new_slots), return_exceptions=True)
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    for r in results:
                        if isinstance(r, WorkerProcess):
                            await r.stop()
                    raise errors[0]
                for slot, worker in zip(new_slots, results, strict=True):
                    assert isinstance(worker, WorkerProcess)
                    slot.worker = worker
                    slot.status = "READY"
                    slot.task = asyncio.create_task(self._slot_loop(slot, worker), name=f"{self.name}-w{slot.slot_id}")
                    self._slots.append(slot)
            elif len(active) > min_workers:
                # Retire idle workers first, the newest first (the oldest are warm and keep their ids); a busy one
                # finishes its batch before it stops.
                victims = sorted(active, key=lambda s: (s.busy, -s.slot_id))[: len(active) - min_workers]
                await asyncio.gather(*(self._retire(s) for s in victims))

    async def _retire(self, slot: WorkerSlot) -> None:
        slot.retiring = True
        slot.status = "UNLOADING"
        if slot.task is not None:
            if not slot.busy:
                slot.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await slot.task
        if slot.worker is not None:
            await slot.worker.stop()
        self._slots.remove(slot)

    async def close(self, grace_s: float = 0.0) -> None:
        """Stop taking work, let queued and in-flight jobs finish within ``grace_s``, then stop every worker."""
        self.accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while (len(self.batcher) or any(s.busy for s in self._slots)) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self.closed = True
        for job in self.batcher.drain():
            if not job.future.done():
                job.future.set_result(error_result(503, "ServiceUnavailableException", "Server is shutting down"))
        await asyncio.gather(*(self._retire(s) for s in list(self._slots)))

    def describe_workers(self) -> list[dict[str, Any]]:
        out = []
        for slot in self._slots:
            w = slot.worker
            out.append(
                {
                    "id": w.worker_id if w else str(9000 + slot.slot_id),
                    "startTime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(w.start_time if w else 0)),
                    "status": slot.status,
                    "memoryUsage": w.memory_bytes() if w else 0,
                    "pid": w.pid if w and w.pid else -1,
                    "gpu": w is not None and w.gpu_id is not None,
                    "gpuId": w.gpu_id if w is not None else None,
                    "gpuUsage": gpu_usage(w),
                    "gpuMemoryUsage": w.gpu_memory_bytes if w else 0,
                    "restarts": slot.crashes,
                    **({"lastError": slot.last_error} if slot.last_error else {}),
                }
            )
        return out


def gpu_usage(worker: WorkerProcess | None) -> str:
    """TorchServe's ``gpuUsage`` string (it asks nvidia-smi; this is the worker's own CUDA allocator's peak)."""
    if worker is None or worker.gpu_id is None:
        return "N/A"
    return f"gpuId::{worker.gpu_id} memory.used [MiB]::{worker.gpu_memory_bytes // 2**20} MiB"


__all__ = ["ModelSpec", "NoWorker", "QueueFull", "ServedModel", "error_body", "error_result"]
