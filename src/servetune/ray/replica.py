"""A Ray Serve replica of one model version. It loads the version exactly as a native worker does (the same
:class:`~servetune.api.plan.VersionPlan`, ``WorkerSpec`` and ``start_service``) and answers TorchServe's
``/predictions/{model}[/{version}]`` itself with the API layer's inference app (the proxy hands it the HTTP request:
one hop).

Batches: ``@serve.batch`` with max size = ``batchSize`` and wait = ``maxBatchDelay``, both from ``user_config``
(changed in place, as are the threads); one batch at a time, run on a thread so that the next batch forms meanwhile.
With a ``controller:`` in the model's config, each replica runs its own controller (``ray/controlled.py``) over its
own batch queue: it moves the replica's batch size and delay and sheds. Other versions of the model are reached
through their deployments' handles. A streaming request (gRPC
StreamPredictions, through the driver's handle) runs alone through ``stream_remote``, which yields the handler's
intermediate answers as it sends them, then its final one.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ray import serve
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from servetune._exceptions import ApiError
from servetune.api.inference import create_inference_app
from servetune.api.metadata import model_metadata
from servetune.api.metrics import ApiMetrics
from servetune.api.plan import VersionPlan
from servetune.api.types import InferRequest, InferResult, ModelMetadata, ModelRef
from servetune.archive import open_archive
from servetune.archive.workdir import owned_workdir, remove_workdir
from servetune.config.server import ServerConfig
from servetune.handlers.service import Request, Service
from servetune.handlers.spec import apply_cpu, start_service
from servetune.ray import handles
from servetune.ray.asgi import call_app
from servetune.ray.controlled import check_reachable, replica_controller
from servetune.ray.metrics import Reporter
from servetune.ray.plan import ServedModel, ray_control
from servetune.ray.serve_config import served_model
from servetune.startup import freeze_heap

DEFAULT_DELAY_S = 0.1


def load(plan: VersionPlan, workdir: Path) -> Service:
    """Open the archive and load its handler the way a native worker does (GPU 0: Ray sets CUDA_VISIBLE_DEVICES to
    the replica's own GPU)."""
    archive = open_archive(Path(plan.archive), workdir / "model")
    spec = plan.worker_spec(archive.model_dir, gpu_id=0 if plan.gpu else None, num_threads=plan.num_threads or 1)
    return start_service(spec)


def _error(request: InferRequest, error: ApiError) -> InferResult:
    return InferResult(error.status, error.body, "application/json", {}, batch_size=1)


class ReplicaView:
    """The inference API's backend inside a replica: its own version through its batch queue, the model's other
    versions (``model``: as served, from the deployment's ``user_config``) through their handles."""

    def __init__(self, replica: ModelReplica, model: ServedModel) -> None:
        self.replica = replica
        self.model = model

    def _other(self, name: str, version: str | None) -> tuple[str, Any | None]:
        """The version meant and, for another deployed version, its handle (None: this replica's own version, or
        one without replicas); ApiError 404 for another model or a version not registered."""
        if name != self.model.name:
            raise ApiError.model_not_found(name)
        meant, deployed = self.model.resolve(version)
        if meant == self.replica.plan.version or not deployed:
            return meant, None
        return meant, handles.version_handle(name, meant)

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResult:
        meant, other = self._other(name, version)
        if meant == self.replica.plan.version:
            return await self.replica.infer(request)
        if other is None:
            raise ApiError.no_worker(name)
        return await handles.infer(other, request)

    def models(self) -> list[ModelRef]:
        return self.model.refs()

    async def healthy(self) -> bool:
        return True  # a replica answering is a running replica (Ray's proxy routes only to those)

    async def ready(self, name: str, version: str | None) -> bool:
        return True

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        meant, other = self._other(name, version)
        if meant == self.replica.plan.version:
            return model_metadata(self.replica.plan, list(self.model.versions), self.replica.service.metadata)
        if other is None:
            return ModelMetadata(name, self.model.versions, "")  # no replica holds its plan: no tensors
        return await handles.metadata(other)


class ModelReplica:
    """Deployment class of a model version: ``plan`` is the version it serves, ``server`` the inference API's
    settings; the model as served (its versions, which are deployed, its default) comes in ``user_config``."""

    def __init__(self, plan: VersionPlan, server: ServerConfig | None = None) -> None:
        self.plan = plan
        self.stuck: str | None = None
        # Ray ends a replica's process without atexit at times: the next replica on the host removes what it left
        workdir = owned_workdir("servetune-replica-")
        atexit.register(remove_workdir, workdir)
        self.service = load(self.plan, workdir)
        self._streams: dict[str, Callable[[InferResult], None]] = {}  # request id -> its intermediate answers
        self.service.context.partial_sink = self._partial
        self.batch_size, self.max_batch_delay_ms = self.plan.batch_size, float(self.plan.max_batch_delay_ms)
        self.set_batching(self.batch_size, self.max_batch_delay_ms)  # ``reconfigure`` tells them again
        self.metrics = ApiMetrics()
        self.waiting: set[int] = set()  # the requests in the batch queue, not yet in a batch (``id()``: a client's
        # own x-request-id may repeat)
        control = ray_control(self.plan)
        if control is not None:  # ConfigError naming the SLA's key: the replica, and its registration, fail
            check_reachable(self.service, control)
        self.controller = replica_controller(self, control, self.metrics.registry)
        self.reporter = Reporter(
            self.metrics.registry,
            f"{self.plan.name}/{self.plan.version}/{os.getpid()}",
            self.controller.describe if self.controller is not None else None,
        )
        self.view = ReplicaView(self, served_model({}, plan))
        self.app = create_inference_app(self.view, server or ServerConfig(), metrics=self.metrics)
        freeze_heap(collect=False)  # Ray's worker, the handler's imports and the model: off the collector's full passes

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """``user_config`` changes apply in place, from the next batch on: the batch size (the batch queue's and the
        handler's ``context.system_properties["batch_size"]``), the batch delay, the intra-op threads, and the model
        as served (another version registered, scaled or made the default). Ray calls this after ``__init__`` and on
        every ``user_config`` change, without restarting the replica."""
        self.view.model = served_model(user_config, self.plan)
        handles.keep_deployed([self.view.model])
        batch_size = int(user_config.get("batch_size", self.plan.batch_size))
        delay_ms = float(user_config.get("max_batch_delay_ms", DEFAULT_DELAY_S * 1000.0))
        self.set_batching(batch_size, delay_ms)
        threads = int(user_config.get("num_threads") or 0)
        if threads:
            apply_cpu(threads, ())

    def set_batching(self, batch_size: int, max_batch_delay_ms: float) -> None:
        """Batch size and delay from the next batch formed (the management API's change, or the controller's)."""
        self.batch_size, self.max_batch_delay_ms = batch_size, max_batch_delay_ms
        self.batched.set_max_batch_size(batch_size)  # type: ignore[attr-defined]
        self.batched.set_batch_wait_timeout_s(max_batch_delay_ms / 1000.0)  # type: ignore[attr-defined]
        self.service.context.system_properties["batch_size"] = batch_size

    def check_health(self) -> None:
        """A replica whose handler overran ``responseTimeout`` is replaced, as a native worker is killed."""
        if self.stuck is not None:
            raise RuntimeError(self.stuck)

    async def infer(self, request: InferRequest) -> InferResult:
        """One request through this version's batch queue; a describe request runs in a batch of its own."""
        if request.control.describe:
            return (await self._run([request]))[0]
        controller = self.controller
        if controller is None:
            result: InferResult = await self.batched(request)
            return result
        controller.ensure_started()
        controller.admit(request.arrival, request.deadline)  # ApiError 503: predicted to miss its deadline
        self.waiting.add(id(request))
        try:
            result = await self.batched(request)
        finally:
            self.waiting.discard(id(request))
        return result

    async def infer_remote(self, request: InferRequest) -> InferResult:
        """``infer`` for the model's other versions' replicas (through a handle): the clock is this process's."""
        request.arrival = time.monotonic()
        return await self.infer(request)

    async def stream_remote(self, request: InferRequest) -> AsyncIterator[tuple[bool, InferResult]]:
        """Run one request alone (a batch of one, as TorchServe's StreamPredictions); yield ``(False, answer)`` for
        each intermediate answer its handler sends, then ``(True, final answer)``. Called through a handle with
        ``stream=True``."""
        request.arrival = time.monotonic()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[InferResult] = asyncio.Queue()

        def deliver(result: InferResult) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, result)

        self._streams[request.request_id] = deliver
        task = asyncio.ensure_future(self._run([request]))
        try:
            while not task.done():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield False, getter.result()
                else:
                    getter.cancel()
            while not queue.empty():  # sent just before the handler returned
                yield False, queue.get_nowait()
            yield True, task.result()[0]
        finally:
            self._streams.pop(request.request_id, None)
            if not task.done():
                task.cancel()

    def _partial(self, request_id: str, status: int, body: bytes, content_type: str | None) -> None:
        """The handler's ``send_intermediate_predict_response`` (on the handler's thread)."""
        deliver = self._streams.get(request_id)
        if deliver is not None:
            deliver(
                InferResult(
                    status, body, content_type, {}, batch_size=1, worker_id=str(os.getpid()), version=self.plan.version
                )
            )

    async def metadata_remote(self) -> ModelMetadata:
        """This version's OIP metadata, for the frontend and the model's other versions (through a handle)."""
        return await self.view.metadata(self.plan.name, self.plan.version)

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=DEFAULT_DELAY_S)
    async def batched(self, requests: list[InferRequest]) -> list[InferResult]:
        if self.controller is None:
            return await self._run(requests)
        for request in requests:
            self.waiting.discard(id(request))
        return await self.controller.run(requests, self._run)

    async def _run(self, requests: list[InferRequest]) -> list[InferResult]:
        started = time.monotonic()
        if self.stuck is not None:  # a timed-out batch may still hold the handler: wait for the replacement
            return [_error(r, ApiError.unavailable(self.stuck)) for r in requests]
        batch = [Request(r.request_id, r.headers, r.inputs, r.control) for r in requests]
        timeout = float(self.plan.response_timeout_s)
        try:
            responses = await asyncio.wait_for(asyncio.to_thread(self.service.predict, batch), timeout)
        except TimeoutError:
            self.stuck = f"worker {os.getpid()} took longer than {timeout:g} s; it is being replaced"
            return [_error(r, ApiError.timeout(self.stuck)) for r in requests]
        handler_ms = (time.monotonic() - started) * 1000.0
        self.metrics.observe_batch(self.plan.name, self.plan.version, len(requests))
        return [
            InferResult(
                r.status,
                r.body,
                r.content_type,
                r.headers,
                queue_ms=(started - request.arrival) * 1000.0,
                handler_ms=handler_ms,
                batch_size=len(requests),
                worker_id=str(os.getpid()),
                version=self.plan.version,
            )
            for request, r in zip(requests, responses, strict=True)
        ]

    async def __call__(self, request: HTTPRequest) -> Response:
        """TorchServe's ``POST|PUT /predictions/{model}[/{version}]``, by the API layer's inference app."""
        self.reporter.ensure_started()
        return await call_app(self.app, request)


__all__ = ["ModelReplica", "ReplicaView", "load"]
