"""TorchServe's gRPC APIs: ``InferenceAPIsService`` (Ping, Predictions, StreamPredictions; port 7070) and
``ManagementAPIsService`` (port 7071), over the same backend and the same :class:`Management` as the REST APIs, so
that each RPC answers what its REST twin answers (the management RPCs' ``msg`` is the REST status message, or the
JSON of describe and list). Field for field TorchServe 0.12's protos: clients generated from them work unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from servetune._exceptions import ApiError
from servetune.api import params as p
from servetune.api.gateway import INFERENCE, MANAGEMENT, PROBE, Answer, Call, Caller, Gateway
from servetune.api.grpc.calls import handler_headers, rpc, send_timing, stream_rpc, version_or_none
from servetune.api.management import SCALE_WAIT_S, Management
from servetune.api.types import InferResult, Input
from servetune.handlers.control import TORCHSERVE, Control
from servetune.protos import TORCHSERVE_INFERENCE, TORCHSERVE_MANAGEMENT, methods

_INFERENCE = methods(TORCHSERVE_INFERENCE)
_MANAGEMENT = methods(TORCHSERVE_MANAGEMENT)
_PREDICT = Control(TORCHSERVE)  # built once
PredictionResponse = _INFERENCE["Predictions"].response
HealthResponse = _INFERENCE["Ping"].response
ManagementResponse = _MANAGEMENT["ListModels"].response


def answer_error(result: InferResult) -> ApiError:
    """A handler's error answer (status >= 300) as the ApiError that carries it: its TorchServe JSON's message."""
    message = result.body.decode("utf-8", "replace")
    kind = "InternalServerException"
    try:
        parsed = json.loads(result.body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        message, kind = parsed["message"], str(parsed.get("type") or kind)
    return ApiError(message, result.status, kind)


class TorchServeInference:
    """``org.pytorch.serve.grpc.inference.InferenceAPIsService``."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @rpc(PROBE)
    async def Ping(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802 - RPC name
        """``/ping``'s answer as TorchServe's gRPC Ping sends it: the JSON in ``health``, always OK."""
        payload: dict[str, Any] = {"status": "Healthy" if await self.gateway.server_ready() else "Unhealthy"}
        if self.gateway.readiness.failed:
            payload["failedModels"] = dict(self.gateway.readiness.failed)
        return HealthResponse(health=json.dumps(payload, indent=2))

    @rpc(INFERENCE)
    async def Predictions(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        answer = await self.infer(request, context, who, None)
        send_timing(context, answer)
        return PredictionResponse(prediction=answer.result.body)

    @stream_rpc(INFERENCE)
    async def StreamPredictions(  # noqa: N802
        self, request: Any, context: grpc.aio.ServicerContext, who: Caller
    ) -> AsyncIterator[Any]:
        """Each intermediate answer the handler sends, then its final one; the request runs in a batch of its own."""
        partials: asyncio.Queue[InferResult] = asyncio.Queue()
        task = asyncio.ensure_future(self.infer(request, context, who, partials.put_nowait))
        try:
            while not task.done():
                getter = asyncio.ensure_future(partials.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break
                yield self._partial(getter.result())
            while not partials.empty():
                yield self._partial(partials.get_nowait())
            final = task.result()
            send_timing(context, final)
            yield PredictionResponse(prediction=final.result.body)
        finally:
            if not task.done():
                task.cancel()

    async def StreamPredictions2(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Not served: UNIMPLEMENTED to every caller (nothing runs, so no token is asked for)."""
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "StreamPredictions2 (stateful sequences) is not supported by servetune; use Predictions or "
            "StreamPredictions",
        )
        yield  # pragma: no cover - an async generator, for gRPC's streaming handler

    def _partial(self, result: InferResult) -> Any:
        if result.status >= 300:
            raise answer_error(result)
        return PredictionResponse(prediction=result.body)

    async def infer(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        who: Caller,
        on_partial: Callable[[InferResult], None] | None,
    ) -> Answer:
        """One ``PredictionsRequest`` through the gateway, as REST ``/predictions`` runs it: its ``input`` map as the
        form's fields; the handler's error answer raised as ApiError."""
        if not request.model_name:
            raise ApiError.bad_request("Parameter model_name is required.")
        inputs = [Input(k, None, v) for k, v in request.input.items()]
        call = Call(
            request.model_name,
            version_or_none(request.model_version),
            inputs,
            _PREDICT,
            handler_headers(context),
            on_partial=on_partial,
        )
        answer = await self.gateway.infer(call, who)
        if answer.result.status >= 300:
            raise answer_error(answer.result)
        return answer


class TorchServeManagement:
    """``org.pytorch.serve.grpc.management.ManagementAPIsService``, through :class:`Management`."""

    def __init__(self, gateway: Gateway, management: Management) -> None:
        self.gateway = gateway
        self.management = management
        self.config = management.config

    def _model_api(self) -> None:
        """Register and unregister need ``enable_model_api``; TorchServe's gRPC answer (PERMISSION_DENIED)."""
        if not self.config.enable_model_api:
            raise ApiError("Model API disabled", 403, "ModelException")

    @rpc(MANAGEMENT)
    async def DescribeModel(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        described = await self.management.describe(
            request.model_name, version_or_none(request.model_version), bool(request.customized)
        )
        return ManagementResponse(msg=json.dumps(described, indent=2))

    @rpc(MANAGEMENT)
    async def ListModels(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        params = {"limit": str(request.limit), "next_page_token": str(request.next_page_token)}
        return ManagementResponse(msg=json.dumps(self.management.list_models(params), indent=2))

    @rpc(MANAGEMENT)
    async def RegisterModel(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        """The REST register, with TorchServe's gRPC reading of the fields: 0 and "" are "not given"."""
        self._model_api()
        raw: dict[str, str] = {"synchronous": "true" if request.synchronous else "false"}
        for key in ("url", "model_name", "handler", "runtime"):
            if getattr(request, key):
                raw[key] = getattr(request, key)
        for key in ("batch_size", "max_batch_delay", "initial_workers", "response_timeout", "startup_timeout"):
            if getattr(request, key) > 0:
                raw[key] = str(getattr(request, key))
        params = p.register_params(raw, self.config.max_workers_per_model)
        _, message = await self.management.register(params)
        return ManagementResponse(msg=message)

    @rpc(MANAGEMENT)
    async def ScaleWorker(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        """``PUT /models/{name}[/{version}]?min_worker=&max_worker=&synchronous=``; ``min_worker`` 0 means 1 and
        ``max_worker`` 0 means ``min_worker``, as TorchServe reads the message."""
        name, version = request.model_name, version_or_none(request.model_version)
        self.management.versions(name, version)
        low = request.min_worker if request.min_worker > 0 else 1
        high = request.max_worker if request.max_worker > 0 else low
        workers = p.scale_params({"min_worker": str(low), "max_worker": str(high)}, self.config.max_workers_per_model)
        _, message = await self.management.scale(name, version, workers, bool(request.synchronous), SCALE_WAIT_S)
        return ManagementResponse(msg=message)

    @rpc(MANAGEMENT)
    async def SetDefault(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        return ManagementResponse(msg=await self.management.set_default(request.model_name, request.model_version))

    @rpc(MANAGEMENT)
    async def UnregisterModel(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        self._model_api()
        if not request.model_name:
            raise ApiError.bad_request("Parameter model_name is required.")
        message = await self.management.unregister(request.model_name, version_or_none(request.model_version))
        return ManagementResponse(msg=message)


__all__ = ["TorchServeInference", "TorchServeManagement", "answer_error"]
