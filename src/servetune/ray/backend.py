"""The Ray backend: TorchServe's APIs over Ray Serve. The driver (this object, in ``servetune serve --backend ray``)
keeps every model's plan and applies it as one declarative Serve config; Ray's proxy serves inference (each model
application's replicas answer with the API layer's inference app); the driver serves management and metrics.

Workers are replicas, a version's deployment in an application of its own (``serve_config``): scaling sets
``num_replicas`` (an autoscaling range when max > min; 0 removes the application and requests get 503); batch size,
delay and threads change in place through ``user_config``; anything the replicas load with (the plan in the
application's args) redeploys that version's replicas, and only those.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from servetune._exceptions import ApiError, ConfigError, WorkerLoadError
from servetune.api.metadata import model_metadata
from servetune.api.metrics import ApiMetrics
from servetune.api.plan import RegisterParams, VersionPlan
from servetune.api.types import (
    InferRequest,
    InferResult,
    ModelMetadata,
    ModelRef,
    ModelStatus,
    Reconfigure,
    WorkerStatus,
)
from servetune.config.server import ServerConfig
from servetune.control import ControlSettings
from servetune.ray.controller import RayCluster
from servetune.ray.metrics import SummedReports, start_sink
from servetune.ray.plan import FRONTEND_APP, ModelPlan, RayVersion, deployment_name, ray_version, read_plan
from servetune.ray.serve_config import serve_config

LOOPBACK = ("127.0.0.1", "localhost", "::1")
REMOVE_WAIT_S = 60.0


def free_port(host: str) -> int:
    """A port that is free now on ``host`` (Ray's proxy needs a number; 0 in the config means "any")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def proxy_location_for(host: str) -> str:
    """One proxy on the head node for a loopback address (nodes of one machine would share the port); else one per
    node, so that a load balancer can spread over them."""
    return "HeadOnly" if host in LOOPBACK else "EveryNode"


def check_config(config: ServerConfig) -> None:
    if config.inference_token_authorization and config.token_auth:
        raise ConfigError(
            "inference_token_authorization=true: the Ray backend's inference API has no token check "
            "(Ray's proxy serves it); keep it private or put an authenticating proxy in front"
        )
    if config.inference_address.scheme != "http":
        raise ConfigError(f"inference_address={config.inference_address.url()}: the Ray backend serves plain http")


class RayBackend:
    name = "ray"

    def __init__(self, config: ServerConfig, address: str | None = None) -> None:
        check_config(config)
        self.config = config
        inference = config.inference_address
        self.port = inference.port or free_port(inference.host)
        self.cluster = RayCluster(
            host=inference.host, port=self.port, proxy_location=proxy_location_for(inference.host), address=address
        )
        self.plans: dict[str, ModelPlan] = {}
        self.metrics: ApiMetrics | None = ApiMetrics(observing=False)
        self._reports = SummedReports()
        self.metrics.register(self._reports)
        self._starting = True
        self._failed: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._frontend: dict[str, Any] | None = None  # the frontend application as last deployed
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def inference_url(self) -> str | None:
        return self.config.inference_address.url(self.port)

    # ---- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Join the cluster and deploy the frontend (``/ping`` says Unhealthy until the start-up models load)."""
        self.cluster.connect()
        self._sink = start_sink()
        self.cluster.deploy(self.serve_config())

    async def started(self, failed: dict[str, str]) -> None:
        """Tell the frontend, and wait until Ray's proxy answers ``/ping`` as the frontend now should (Healthy, or
        Unhealthy naming the failed models), so that the server says it is up only when it is."""
        self._starting, self._failed = False, dict(failed)
        await self._deploy()
        self._tasks.append(asyncio.create_task(self._reports.refresh_forever(self._sink)))
        await asyncio.to_thread(self._wait_ping, bool(failed), float(self.config.default_startup_timeout))

    def _wait_ping(self, failed: bool, timeout_s: float) -> bool:
        url = f"{self.inference_url}/ping"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5.0) as response:
                    if not failed and response.status == 200:
                        return True
            except urllib.error.HTTPError as exc:
                if failed and b"failedModels" in exc.read():
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    async def close(self, grace_s: float) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.to_thread(self.cluster.shutdown)

    def serve_config(self) -> dict[str, Any]:
        return serve_config(
            list(self.plans.values()),
            host=self.cluster.host,
            port=self.port,
            proxy_location=self.cluster.proxy_location,
            server=self.config,
            starting=self._starting,
            failed=self._failed,
        )

    async def _deploy(self) -> None:
        """Apply the config; when the frontend's args changed (models served, idle, failed), wait until the new
        frontend answers, so that what the management API just said holds for the next request."""
        from servetune.ray import handles

        config = self.serve_config()
        frontend = config["applications"][0]
        await asyncio.to_thread(self.cluster.deploy, config)
        handles.keep_deployed([model.served for model in self.plans.values()])
        if frontend != self._frontend:
            self._frontend = frontend
            await asyncio.to_thread(self.cluster.wait_running, FRONTEND_APP, REMOVE_WAIT_S)

    # ---- lookup ------------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> RayVersion:
        model = self.plans.get(name)
        if model is None:
            raise ApiError.model_not_found(name)
        return model.get(version)

    def _put(self, version: RayVersion, default: str | None = None) -> None:
        model = self.plans.get(version.name)
        versions = {**(model.versions if model else {}), version.version: version}
        self.plans[version.name] = ModelPlan(
            version.name, versions, default or (model.default_version if model else version.version)
        )

    def models(self) -> list[ModelRef]:
        return [
            ModelRef(name, v, rv.plan.url, v == model.default_version)
            for name, model in sorted(self.plans.items())
            for v, rv in sorted(model.versions.items())
        ]

    # ---- inference (through handles: the driver's own calls, e.g. a customized describe) -----

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResult:
        from servetune.ray import handles  # imports Ray: only once a request needs it

        model = self.plans.get(name)
        if model is None:
            raise ApiError.model_not_found(name)
        meant, deployed = model.served.resolve(version)
        if not deployed:
            raise ApiError.no_worker(name)
        return await handles.infer(handles.version_handle(name, meant), request)

    async def healthy(self) -> bool:
        from servetune.ray.frontend import cluster_healthy, served_applications

        served = served_applications([model.served for model in self.plans.values()])
        return not self._starting and not self._failed and await asyncio.to_thread(cluster_healthy, served)

    async def ready(self, name: str, version: str | None) -> bool:
        rv = self.get(name, version)
        if rv.min_workers == 0:
            return True
        count = None if rv.autoscaling else rv.min_workers
        return await asyncio.to_thread(self.cluster.wait_replicas, name, rv.version, count, 0.0)

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        """Asked of a replica of the version (its handler's metadata is there); a version without replicas declares
        only what its model-config.yaml does."""
        from ray.exceptions import RayError

        from servetune.ray import handles

        rv = self.get(name, version)
        if not rv.serving:
            return model_metadata(rv.plan, list(self.plans[name].versions))
        handle = handles.version_handle(name, rv.version)
        try:
            metadata: ModelMetadata = await handle.metadata_remote.remote()
        except RayError as exc:
            raise ApiError.unavailable(f"Worker died while reading the model's metadata: {exc}") from None
        return metadata

    # ---- management --------------------------------------------------------------------------

    async def plan(self, archive_path: str, params: RegisterParams) -> VersionPlan:
        return (await asyncio.to_thread(read_plan, self.config, Path(archive_path), params)).plan

    async def add(self, plan: VersionPlan) -> None:
        """Register the version with its planned replicas and deploy once; ``scale`` then waits for them."""
        version = ray_version(plan)
        async with self._lock:
            model = self.plans.get(plan.name)
            if model is not None and plan.version in model.versions:
                raise ApiError.conflict(f"Model version {plan.version} is already registered for model {plan.name}")
            names = {deployment_name(plan.name, v) for v in (model.versions if model else {})}
            if deployment_name(plan.name, plan.version) in names:
                raise ApiError.bad_request(
                    f"model {plan.name}: version {plan.version!r} maps to a deployment name in use"
                )
            self._put(version)
            await self._deploy()

    async def scale(self, name: str, version: str | None, min_workers: int, max_workers: int, wait_s: float) -> bool:
        async with self._lock:
            rv = self.get(name, version).scaled(min_workers, max_workers)
            self._put(rv)
            await self._deploy()
        if wait_s <= 0:
            return True
        count = None if rv.autoscaling else min_workers
        scaled = await asyncio.to_thread(self.cluster.wait_replicas, name, rv.version, count, wait_s)
        await self._settle(name)
        return scaled

    async def remove(self, name: str, version: str | None, grace_s: float) -> None:
        async with self._lock:
            rv = self.get(name, version)
            model = self.plans[name]
            rest = {v: p for v, p in model.versions.items() if v != rv.version}
            if rest:
                default = model.default_version if model.default_version in rest else sorted(rest)[0]
                self.plans[name] = ModelPlan(name, rest, default)
            else:
                del self.plans[name]
            await self._deploy()
        await asyncio.to_thread(self.cluster.wait_replicas, name, rv.version, 0, REMOVE_WAIT_S)
        await self._settle(name)

    async def set_default(self, name: str, version: str) -> None:
        async with self._lock:
            self.get(name, version)
            self.plans[name] = replace(self.plans[name], default_version=version)
            await self._deploy()
        await self._settle(name)

    async def _settle(self, name: str) -> None:
        """Wait until the default version's application has applied the model as now served (its versions, which
        are deployed, its default: told to its replicas in place) and its route, so that the next call sees the model
        as it now is."""
        model = self.plans.get(name)
        if model is None or not model.serving:
            return
        with contextlib.suppress(WorkerLoadError):
            await asyncio.to_thread(self.cluster.wait_replicas, name, model.default_version, None, REMOVE_WAIT_S)

    async def reconfigure(self, name: str, version: str | None, change: Reconfigure) -> None:
        if change.cpu_pinning:
            raise ApiError.bad_request("cpu_pinning is not supported on the Ray backend (Ray places replicas)")
        async with self._lock:
            rv = self.get(name, version)
            if change.inter_op_threads is not None:  # read at load: new replicas (the plan in the args changes)
                config = replace(rv.plan.config, inter_op_threads=change.inter_op_threads)
                rv = replace(rv, plan=rv.plan.with_config(config))
            rv = replace(
                rv,
                batch_size=change.batch_size or rv.batch_size,
                max_batch_delay_ms=rv.max_batch_delay_ms
                if change.max_batch_delay_ms is None
                else change.max_batch_delay_ms,
                num_threads=change.num_threads or rv.num_threads,
            )
            self._put(rv)
            await self._deploy()
        if rv.serving:
            try:
                await asyncio.to_thread(self.cluster.wait_replicas, name, rv.version, None, REMOVE_WAIT_S)
            except WorkerLoadError as exc:
                raise ApiError.internal(f"Failed to apply the change to model {name}: {exc}") from None

    async def status(self, name: str, version: str | None) -> ModelStatus:
        rv = self.get(name, version)
        replicas, deployment = await asyncio.to_thread(
            lambda: (self.cluster.replicas(name, rv.version), self.cluster.deployment_status(name, rv.version))
        )
        workers = [
            WorkerStatus(
                id=r.actor_id[:12],
                status="READY" if r.state == "ALIVE" else r.state,
                start_time=r.start_time,
                pid=r.pid,
                memory_bytes=r.memory_bytes,
                gpu_id=0 if rv.plan.gpu else None,
                num_threads=rv.num_threads,
                inter_op_threads=rv.plan.config.inter_op_threads or None,
                extra={"node": r.node_id},
            )
            for r in replicas
        ]
        config = replace(rv.plan.config, batch_size=rv.batch_size, max_batch_delay_ms=rv.max_batch_delay_ms)
        running = int(deployment.get("replicaStates", {}).get("RUNNING", 0))
        extra: dict[str, Any] = {"backend": "ray", "deployment": deployment}
        if rv.control is not None:
            pids = {str(r.pid) for r in replicas}
            extra["controller"] = await self._controllers(rv.name, rv.version, rv.control, pids)
        return ModelStatus(
            plan=rv.plan.with_config(config),
            is_default=self.plans[name].default_version == rv.version,
            min_workers=rv.min_workers,
            max_workers=rv.max_workers,
            batch_size=rv.batch_size,
            max_batch_delay_ms=rv.max_batch_delay_ms,
            healthy=running >= rv.min_workers,
            workers=workers,
            device_type="gpu" if rv.plan.gpu else "cpu",
            num_threads=rv.num_threads,
            inter_op_threads=rv.plan.config.inter_op_threads,
            cpu_pinning=False,
            extra=extra,
        )

    async def _controllers(self, name: str, version: str, settings: ControlSettings, pids: set[str]) -> dict[str, Any]:
        """The controller block of a version's describe: the settings, and each live replica's controller as it last
        reported it (a replica reports once it has served a request)."""
        import ray

        prefix = f"{name}/{version}/"
        reported: dict[str, dict[str, Any]]
        try:
            reported = await asyncio.to_thread(ray.get, self._sink.controllers_of.remote(prefix), timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - describe must answer even when the sink does not
            reported, error = {}, f"{type(exc).__name__}: {exc}"
        else:
            error = ""
        return {
            "policy": settings.policy,
            "settings": settings.to_json(),
            "replicas": {pid: reported[pid] for pid in sorted(reported) if pid in pids},  # each live replica's
            **({"lastError": error} if error else {}),
        }


__all__ = ["RayBackend", "check_config", "free_port", "proxy_location_for"]
