"""The native backend: servetune's own frontend process and worker processes behind TorchServe's APIs.

Archives are extracted into a private working directory (never into the model store); each version is a
:class:`~servetune.server.model.ServedModel` with its batcher and worker pool; one :class:`Placement` shares the
host's GPUs and cores among every model's workers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from servetune._exceptions import ApiError, ArchiveError
from servetune.api.metadata import model_metadata
from servetune.api.metrics import ApiMetrics, ModelGauges, WorkerMemoryGauges
from servetune.api.plan import RegisterParams, VersionPlan, plan_version
from servetune.api.types import InferRequest, InferResult, ModelMetadata, ModelRef, ModelStatus, Reconfigure
from servetune.archive import open_archive
from servetune.archive.workdir import owned_workdir, remove_workdir
from servetune.config.server import ServerConfig
from servetune.control.metrics import ControllerMetrics
from servetune.hardware import detect_gpus
from servetune.server import early
from servetune.server.controlled import check_reachable, control_settings
from servetune.server.model import ModelRegistry, ServedModel
from servetune.server.placement import Placement
from servetune.startup import log as startup_log


class NativeBackend:
    name = "native"
    inference_url: str | None = None

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.registry = ModelRegistry()
        gpus = detect_gpus()
        self.placement = Placement(gpus if config.number_of_gpu is None else min(config.number_of_gpu, gpus))
        self.metrics: ApiMetrics | None = ApiMetrics()
        self.metrics.register(
            ModelGauges(lambda: [(m.name, m.version, m.ready_workers, len(m.batcher)) for m in self.registry.all()])
        )
        self.metrics.register(WorkerMemoryGauges(self._worker_memory))
        self.metrics.register(ControllerMetrics(lambda: [m.controller for m in self.registry.all() if m.controller]))
        self._workdir = owned_workdir("servetune-models-")  # first removing those of servers that were killed
        self._extracted: dict[str, Path] = {}  # model dir -> the extraction directory to delete with it

    def _worker_memory(self) -> list[tuple[str, str, str, int, int | None]]:
        rows = [
            (m.name, m.version, w.id, w.memory_bytes, w.pss_bytes)
            for m in self.registry.all()
            for w in m.pool.statuses()
            if w.pid > 0
        ]
        for m in self.registry.all():
            for name, parent in m.pool.forking.parents():
                rss, pss = parent.memory()
                rows.append((m.name, m.version, name, rss, pss))
        return rows

    def open(self) -> None:
        """Nothing to connect to: workers start when models scale."""

    async def started(self, failed: dict[str, str]) -> None:
        """The start-up models have loaded (the inference API reads the outcome itself): a parent started early
        (``servetune.server.early``) that no model took is stopped."""
        early.release()

    @property
    def device_type(self) -> str:
        return "gpu" if self.placement.gpus else "cpu"

    def default_workers(self) -> int:
        """Workers of a start-up model that names none: ``default_workers_per_model``, else a GPU's or a CPU's."""
        return self.config.default_workers_per_model or self.placement.gpus or os.cpu_count() or 1

    # ---- inference ---------------------------------------------------------------------------

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResult:
        return await self.registry.get(name, version).submit(request)

    def submit(self, name: str, version: str | None, request: InferRequest) -> asyncio.Future[InferResult]:
        """:meth:`infer` without a coroutine: the request queued, its answer a future (``Gateway.submit``)."""
        return self.registry.get(name, version).submit(request)

    def models(self) -> list[ModelRef]:
        return [ModelRef(m.name, m.version, m.plan.url, self.registry.is_default(m)) for m in self.registry.all()]

    async def healthy(self) -> bool:
        return all(self.registry.get(name).healthy() for name in self.registry.models)

    async def ready(self, name: str, version: str | None) -> bool:
        return self.ready_now(name, version)

    def ready_now(self, name: str, version: str | None) -> bool:
        """:meth:`ready` without a coroutine (``Gateway.submit``)."""
        return self.registry.get(name, version).healthy()

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        model = self.registry.get(name, version)
        versions = [m.version for m in self.registry.all() if m.name == name]
        return model_metadata(model.plan, versions, model.pool.handler_metadata())

    # ---- management --------------------------------------------------------------------------

    async def plan(self, archive_path: str, params: RegisterParams) -> VersionPlan:
        """Extract the archive into the working directory (a directory archive is used in place) and plan it; the
        plan's ``archive`` is the directory the workers load from."""
        dest = Path(tempfile.mkdtemp(prefix="archive-", dir=self._workdir))
        started = time.perf_counter()
        try:
            # Extraction, reading and YAML parsing (and planning, which checks the files) on a thread: /ping and the
            # other models' requests go on meanwhile.
            archive = await asyncio.to_thread(open_archive, Path(archive_path), dest)
            startup_log.debug(
                "start-up: archive %s opened (extracted once for all its workers) %.0f ms",
                Path(archive_path).name,
                (time.perf_counter() - started) * 1000.0,
            )
            plan = await asyncio.to_thread(
                plan_version, self.config, archive, Path(archive_path), params, self.default_workers()
            )
        except BaseException as exc:
            await asyncio.to_thread(shutil.rmtree, dest, ignore_errors=True)
            if isinstance(exc, ArchiveError):
                raise ApiError.bad_archive(f"Failed to open model archive {params.url}: {exc}") from None
            raise
        self._extracted[str(archive.model_dir)] = dest
        try:
            control_settings(plan, self.config.max_workers_per_model)  # refused now, naming the key
        except ApiError:
            await self._forget(str(archive.model_dir))
            raise
        return VersionPlan(**{**plan.__dict__, "archive": str(archive.model_dir)})

    async def add(self, plan: VersionPlan) -> None:
        control = control_settings(plan, self.config.max_workers_per_model)
        model = ServedModel(plan, Path(plan.archive), self.placement, self.metrics, control)
        try:
            self.registry.add(model)
        except ApiError:
            await self._forget(plan.archive)
            raise

    async def scale(self, name: str, version: str | None, min_workers: int, max_workers: int, wait_s: float) -> bool:
        """Workers start here, so a scale always runs to its end (``wait_s`` is for backends that cannot tell)."""
        model = self.registry.get(name, version)
        await model.scale(min_workers, max_workers)
        if model.control is not None and model.batch1_ms is None and min_workers > 0:
            model.batch1_ms = await check_reachable(model, model.control)  # ApiError 400: the SLA cannot hold
        return True

    async def remove(self, name: str, version: str | None, grace_s: float) -> None:
        model = self.registry.get(name, version)
        self.registry.remove(model)
        await model.close(grace_s)
        await self._forget(model.plan.archive)

    async def set_default(self, name: str, version: str) -> None:
        self.registry.set_default(name, version)

    async def reconfigure(self, name: str, version: str | None, change: Reconfigure) -> None:
        await self.registry.get(name, version).reconfigure(change)

    async def status(self, name: str, version: str | None) -> ModelStatus:
        model = self.registry.get(name, version)
        device = model.plan.config.device_type or self.device_type
        return model.status(self.registry.is_default(model), device)

    async def close(self, grace_s: float) -> None:
        models = self.registry.all()
        await asyncio.gather(*(m.close(grace_s) for m in models), return_exceptions=True)
        self.registry = ModelRegistry()
        remove_workdir(self._workdir)

    async def _forget(self, model_dir: str) -> None:
        """Delete a version's extracted files, on a thread: a model's files can be gigabytes."""
        dest = self._extracted.pop(model_dir, None)
        if dest is not None:
            await asyncio.to_thread(shutil.rmtree, dest, ignore_errors=True)


__all__ = ["NativeBackend"]
