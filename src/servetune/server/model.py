"""The served model versions: each one (:class:`ServedModel`: its plan, its batcher and its worker pool; requests in,
status out) and the registry of them (:class:`ModelRegistry`: every model's versions and its default)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from servetune._exceptions import ApiError
from servetune.api.metrics import ApiMetrics
from servetune.api.plan import VersionPlan
from servetune.api.types import InferRequest, InferResult, ModelStatus, Reconfigure
from servetune.control import Controller, ControlSettings
from servetune.server.batcher import Batcher, Job, QueueFull
from servetune.server.controlled import ModelActuator
from servetune.server.placement import Demand, Placement
from servetune.server.pool import WorkerPool


class ServedModel:
    """One model version: accepts requests into its batcher; its pool keeps ``min_workers`` workers serving them."""

    def __init__(
        self,
        plan: VersionPlan,
        model_dir: Path,
        placement: Placement,
        metrics: ApiMetrics | None = None,
        control: ControlSettings | None = None,
    ) -> None:
        self.plan = plan
        self.model_dir = model_dir
        self.placement = placement
        self.control = control  # the online controller's settings (None: knobs as configured)
        self.batcher = Batcher(plan.batch_size, plan.max_batch_delay_ms / 1000.0, plan.job_queue_size)
        # each batch's size is observed by the pool, where the batch ends
        self.pool = WorkerPool(self, metrics.batch_observer(plan.name, plan.version) if metrics is not None else None)
        self.min_workers = 0
        self.max_workers = 0
        self.accepting = True
        self.controller: Controller | None = None  # started with the first workers
        self.batch1_ms: float | None = None  # measured at registration with ``controller.probe``

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def version(self) -> str:
        return self.plan.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.plan.name, self.plan.version)

    @property
    def ready_workers(self) -> int:
        return self.pool.ready

    def healthy(self) -> bool:
        return self.pool.ready >= self.min_workers and not self.pool.crash_loop

    # ---- requests ----------------------------------------------------------------------------

    def submit(self, request: InferRequest) -> asyncio.Future[InferResult]:
        """Queue a request; ApiError 503 at once (no worker, a full queue, shutting down) rather than a hang."""
        if not self.accepting:
            raise ApiError.unavailable("Server is shutting down")
        # Queue while a worker (re)starts; refuse at once when there is none, or every one is failing to start.
        if not self.pool.serving:
            raise ApiError.no_worker(self.name)
        if self.controller is not None:  # counts the arrival; sheds (503) what would miss its deadline
            self.controller.admit(request.arrival, request.deadline)
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        try:
            self.batcher.put(Job(request, future))
        except QueueFull:
            raise ApiError.queue_full(self.name, self.batcher.capacity) from None
        return future

    # ---- changes -----------------------------------------------------------------------------

    def demand(self, workers: int, plan: VersionPlan | None = None) -> Demand:
        plan = plan or self.plan
        return Demand(workers, plan.config.num_threads or plan.default_threads, plan.cpu_pinning)

    async def scale(self, min_workers: int, max_workers: int) -> None:
        """Start or retire workers; the placement refuses (ApiError 400) a pinning that does not fit first."""
        self.placement.demand(self.key, self.demand(min_workers))
        self.min_workers = min_workers
        self.max_workers = max(min_workers, max_workers)
        await self.pool.scale(min_workers)
        if self.control is not None and self.controller is None and not self.pool.closed:
            self.controller = Controller(self.name, self.version, self.control, ModelActuator(self))
            self.batcher.dispatch_by = self.controller.dispatch_by
            self.batcher.reserve_by = self.controller.reserve_by
            self.controller.start()

    def set_batching(self, batch_size: int, max_batch_delay_ms: float) -> None:
        """Batch size and delay from the next batch formed (the controller's change: a delay may be fractional)."""
        config = replace(self.plan.config, batch_size=batch_size, max_batch_delay_ms=round(max_batch_delay_ms))
        self.plan = self.plan.with_config(config)
        self.batcher.reconfigure(batch_size, max_batch_delay_ms / 1000.0)

    def set_threads(self, threads: int) -> None:
        """Intra-op threads per worker from the next batch each worker runs (the controller's change); ApiError 400
        when pinned workers would no longer fit the CPUs (nothing changes then)."""
        plan = self.plan.with_config(replace(self.plan.config, num_threads=threads))
        self.placement.demand(self.key, self.demand(self.min_workers, plan))
        self.plan = plan

    async def reconfigure(self, change: Reconfigure) -> None:
        """Batch size and delay: from the next batch the batcher forms (the handler's context follows with it).
        Threads and pinning: from the next batch each worker runs. Inter-op threads: new workers, one at a time."""
        config = self.plan.config
        values: dict[str, Any] = {  # ``for_workers`` is not a setting: the scale that follows applies it
            "batch_size": change.batch_size,
            "max_batch_delay_ms": change.max_batch_delay_ms,
            "num_threads": change.num_threads,
            "inter_op_threads": change.inter_op_threads,
            "cpu_pinning": change.cpu_pinning,
        }
        plan = self.plan.with_config(replace(config, **{k: v for k, v in values.items() if v is not None}))
        workers = self.min_workers if change.for_workers is None else change.for_workers
        self.placement.demand(self.key, self.demand(workers, plan))  # refused before anything changes
        restart = change.inter_op_threads is not None and change.inter_op_threads != config.inter_op_threads
        self.plan = plan
        self.batcher.reconfigure(plan.batch_size, plan.max_batch_delay_ms / 1000.0)
        if restart:
            await self.pool.restart()

    async def close(self, grace_s: float = 0.0) -> None:
        """Stop taking work, let queued and in-flight jobs finish within ``grace_s``, then stop every worker."""
        self.accepting = False
        if self.controller is not None:
            await self.controller.close()
        deadline = time.monotonic() + grace_s
        while (len(self.batcher) or self.pool.busy) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for job in self.batcher.drain():
            if not job.future.done():
                job.future.set_exception(ApiError.unavailable("Server is shutting down"))
        await self.pool.close()
        self.placement.release(self.key)

    # ---- describe ----------------------------------------------------------------------------

    def status(self, is_default: bool, device_type: str) -> ModelStatus:
        plan = self.plan
        return ModelStatus(
            plan=plan,
            is_default=is_default,
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            batch_size=self.batcher.batch_size,
            max_batch_delay_ms=int(self.batcher.max_delay_s * 1000),
            healthy=self.healthy(),
            workers=self.pool.statuses(),
            device_type=device_type,
            crash_loop=self.pool.crash_loop,
            queue_capacity=self.batcher.capacity,
            queue_pending=len(self.batcher),
            num_threads=plan.num_threads,
            inter_op_threads=plan.config.inter_op_threads,
            cpu_pinning=plan.cpu_pinning,
            extra=self._control_status(),
        )

    def _control_status(self) -> dict[str, Any]:
        if self.control is None:
            return {}
        if self.controller is None:
            return {"controller": {"policy": self.control.policy, "state": "not started (no workers yet)"}}
        described = self.controller.describe()
        if self.batch1_ms is not None:
            described["batch1Ms"] = round(self.batch1_ms, 3)
        return {"controller": described}


class ModelRegistry:
    """The served versions of each model and each model's default version."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, ServedModel]] = {}
        self.defaults: dict[str, str] = {}

    def all(self) -> list[ServedModel]:
        return [m for name in sorted(self.models) for _, m in sorted(self.models[name].items())]

    def get(self, name: str, version: str | None = None) -> ServedModel:
        versions = self.models.get(name)
        if not versions:
            raise ApiError.model_not_found(name)
        if version is None:
            return versions[self.defaults[name]]
        found = versions.get(version)
        if found is None:
            raise ApiError.version_not_found(name, version)
        return found

    def is_default(self, model: ServedModel) -> bool:
        return self.defaults.get(model.name) == model.version

    def add(self, model: ServedModel) -> None:
        """Register a version; a new model takes it as its default. ApiError 409 if it is registered already."""
        versions = self.models.setdefault(model.name, {})
        if model.version in versions:
            raise ApiError.conflict(f"Model version {model.version} is already registered for model {model.name}")
        versions[model.version] = model
        self.defaults.setdefault(model.name, model.version)

    def remove(self, model: ServedModel) -> None:
        versions = self.models.get(model.name, {})
        if versions.get(model.version) is not model:
            return
        del versions[model.version]
        if not versions:
            self.models.pop(model.name, None)
            self.defaults.pop(model.name, None)
        elif self.defaults.get(model.name) == model.version:
            self.defaults[model.name] = sorted(versions)[0]

    def set_default(self, name: str, version: str) -> None:
        self.get(name, version)
        self.defaults[name] = version


__all__ = ["ModelRegistry", "ServedModel"]
