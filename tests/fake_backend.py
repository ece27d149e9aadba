"""A fake :class:`~servetune.api.types.Backend` that runs in the test process: the seam the protocol suites run on.

Each version's handler is loaded with the worker runtime (``load_service``: the same envelopes, codec and control a
worker uses) in this process, its requests queued by servetune's own batcher (batch size, delay, queue bound) and
each batch run on a thread. What it leaves out is what a backend adds below the API: worker processes, their
supervision and restarts, placement, CPU settings, response timeouts. Those paths keep their real-server suites
(tests/test_server_*.py for the native backend, tests/test_ray_serve.py for Ray, and tests/test_api_backends.py, the
smoke suite every protocol runs through on both backends).

Handlers run inside the test process: an in-process suite never sends a body that makes a test handler exit.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servetune._exceptions import ApiError, ArchiveError
from servetune.api.metadata import model_metadata
from servetune.api.metrics import ApiMetrics
from servetune.api.plan import RegisterParams, VersionPlan, plan_version
from servetune.api.types import (
    InferRequest,
    InferResult,
    ModelMetadata,
    ModelRef,
    ModelStatus,
    Reconfigure,
    WorkerStatus,
)
from servetune.archive import open_archive
from servetune.config.server import ServerConfig
from servetune.handlers.service import Request, Service, load_service
from servetune.server.batcher import Batcher, Job, QueueFull

FAKE_WORKER_ID = "9000"


@dataclass
class FakeVersion:
    """One version: its plan, its handler loaded in this process, its batcher and the task that runs its batches."""

    plan: VersionPlan
    service: Service
    batcher: Batcher
    min_workers: int = 0
    max_workers: int = 0
    task: asyncio.Task[None] | None = None
    streams: dict[str, Any] = field(default_factory=dict)  # request id -> its on_partial, while its batch runs

    @property
    def serving(self) -> bool:
        return self.min_workers > 0 and self.task is not None and not self.task.done()


class FakeBackend:
    """servetune's ``Backend`` contract in this process (see the module)."""

    name = "fake"
    inference_url: str | None = None

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics: ApiMetrics | None = ApiMetrics()
        self.versions: dict[tuple[str, str], FakeVersion] = {}
        self.defaults: dict[str, str] = {}
        self._workdir = Path(tempfile.mkdtemp(prefix="servetune-fake-"))

    # ---- lookup ------------------------------------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> FakeVersion:
        if name not in self.defaults:
            raise ApiError.model_not_found(name)
        found = self.versions.get((name, version or self.defaults[name]))
        if found is None:
            raise ApiError.version_not_found(name, str(version))
        return found

    def models(self) -> list[ModelRef]:
        return [
            ModelRef(name, version, v.plan.url, self.defaults.get(name) == version)
            for (name, version), v in sorted(self.versions.items())
        ]

    # ---- inference ---------------------------------------------------------------------------------------------------

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResult:
        found = self.get(name, version)
        if not found.serving:
            raise ApiError.no_worker(name)
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        try:
            found.batcher.put(Job(request, future))
        except QueueFull:
            raise ApiError.queue_full(name, found.batcher.capacity) from None
        return await future

    async def _run_batches(self, found: FakeVersion) -> None:
        loop = asyncio.get_running_loop()
        observe = self.metrics.batch_observer(found.plan.name, found.plan.version) if self.metrics else None
        while True:
            batch = await found.batcher.next_batch()
            started = time.monotonic()
            for job in batch:
                if job.request.on_partial is not None:
                    found.streams[job.request.request_id] = job.request.on_partial
            requests = [Request(j.request.request_id, j.request.headers, j.request.inputs, j.request.control)
                        for j in batch]
            try:
                responses = await asyncio.to_thread(found.service.predict, requests)
            finally:
                for job in batch:
                    found.streams.pop(job.request.request_id, None)
            handler_ms = (time.monotonic() - started) * 1000.0
            for job, r in zip(batch, responses, strict=True):
                if not job.future.done():
                    result = InferResult(
                        r.status,
                        r.body,
                        r.content_type,
                        r.headers,
                        queue_ms=(started - job.arrival) * 1000.0,
                        handler_ms=handler_ms,
                        batch_size=len(batch),
                        worker_id=FAKE_WORKER_ID,
                        version=found.plan.version,
                    )
                    loop.call_soon(_resolve, job.future, result)
            if observe is not None:
                observe(len(batch))

    def _partial_sink(self, found: FakeVersion, loop: asyncio.AbstractEventLoop) -> Any:
        def deliver(request_id: str, status: int, body: bytes, content_type: str | None) -> None:  # handler's thread
            on_partial = found.streams.get(request_id)
            if on_partial is not None:
                result = InferResult(status, body, content_type, {}, batch_size=1, worker_id=FAKE_WORKER_ID)
                loop.call_soon_threadsafe(on_partial, result)

        return deliver

    async def healthy(self) -> bool:
        return all([await self.ready(name, None) for name in list(self.defaults)])

    async def ready(self, name: str, version: str | None) -> bool:
        found = self.get(name, version)
        return found.min_workers == 0 or found.serving

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        found = self.get(name, version)
        versions = [v for (n, v) in self.versions if n == name]
        return model_metadata(found.plan, versions, found.service.metadata if found.serving else None)

    # ---- management --------------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Nothing to connect to."""

    async def started(self, failed: dict[str, str]) -> None:
        """Nothing to do."""

    async def plan(self, archive_path: str, params: RegisterParams) -> VersionPlan:
        dest = Path(tempfile.mkdtemp(prefix="archive-", dir=self._workdir))
        try:
            archive = await asyncio.to_thread(open_archive, Path(archive_path), dest)
        except ArchiveError as exc:
            raise ApiError.bad_archive(f"Failed to open model archive {params.url}: {exc}") from None
        plan = await asyncio.to_thread(plan_version, self.config, archive, Path(archive_path), params, 1)
        return replace(plan, archive=str(archive.model_dir))

    async def add(self, plan: VersionPlan) -> None:
        if (plan.name, plan.version) in self.versions:
            raise ApiError.conflict(f"Model version {plan.version} is already registered for model {plan.name}")
        service = await asyncio.to_thread(
            load_service,
            model_dir=Path(plan.archive),
            manifest=plan.manifest,
            model_name=plan.name,
            gpu_id=None,
            batch_size=plan.batch_size,
            model_yaml_config=plan.config.handler_config,
            limit_max_image_pixels=plan.limit_max_image_pixels,
            decode_input_request=plan.decode_input_request,
            service_envelope=plan.service_envelope,
        )
        batcher = Batcher(plan.batch_size, plan.max_batch_delay_ms / 1000.0, plan.job_queue_size)
        found = FakeVersion(plan, service, batcher)
        service.context.partial_sink = self._partial_sink(found, asyncio.get_running_loop())
        self.versions[(plan.name, plan.version)] = found
        self.defaults.setdefault(plan.name, plan.version)

    async def scale(self, name: str, version: str | None, min_workers: int, max_workers: int, wait_s: float) -> bool:
        found = self.get(name, version)
        found.min_workers, found.max_workers = min_workers, max(min_workers, max_workers)
        if min_workers > 0 and found.task is None:
            found.task = asyncio.create_task(self._run_batches(found))
        elif min_workers == 0 and found.task is not None:
            found.task.cancel()
            found.task = None
        return True

    async def remove(self, name: str, version: str | None, grace_s: float) -> None:
        found = self.get(name, version)
        if found.task is not None:
            found.task.cancel()
        for job in found.batcher.drain():
            if not job.future.done():
                job.future.set_exception(ApiError.unavailable("Model is being unregistered"))
        key = (found.plan.name, found.plan.version)
        del self.versions[key]
        if self.defaults.get(name) == key[1]:
            left = sorted(v for (n, v) in self.versions if n == name)
            if left:
                self.defaults[name] = left[0]
            else:
                del self.defaults[name]

    async def set_default(self, name: str, version: str) -> None:
        self.get(name, version)
        self.defaults[name] = version

    async def reconfigure(self, name: str, version: str | None, change: Reconfigure) -> None:
        found = self.get(name, version)
        values = {"batch_size": change.batch_size, "max_batch_delay_ms": change.max_batch_delay_ms}
        config = replace(found.plan.config, **{k: v for k, v in values.items() if v is not None})
        found.plan = found.plan.with_config(config)
        found.batcher.reconfigure(found.plan.batch_size, found.plan.max_batch_delay_ms / 1000.0)
        found.service.context.system_properties["batch_size"] = found.plan.batch_size

    async def status(self, name: str, version: str | None) -> ModelStatus:
        found = self.get(name, version)
        plan = found.plan
        workers = [WorkerStatus(FAKE_WORKER_ID, "READY", pid=os.getpid())] if found.serving else []
        return ModelStatus(
            plan,
            self.defaults[name] == plan.version,
            found.min_workers,
            found.max_workers,
            plan.batch_size,
            plan.max_batch_delay_ms,
            await self.ready(name, version),
            workers,
            "cpu",
            queue_capacity=found.batcher.capacity,
            queue_pending=len(found.batcher),
        )

    async def close(self, grace_s: float) -> None:
        for found in self.versions.values():
            if found.task is not None:
                found.task.cancel()
        self.versions.clear()
        self.defaults.clear()
        shutil.rmtree(self._workdir, ignore_errors=True)


def _resolve(future: asyncio.Future[InferResult], result: InferResult) -> None:
    if not future.done():
        future.set_result(result)
