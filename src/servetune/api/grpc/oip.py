"""The Open Inference Protocol (KServe v2) gRPC service, ``inference.GRPCInferenceService``, on the inference gRPC
port beside TorchServe's service (as TorchServe 0.10+ serves it), over any backend.

Readiness is real: ServerReady is REST ``/ping``'s rule, ModelReady the model's minimum of workers; while the
start-up models load, ModelReady of a model not registered yet is false, not NOT_FOUND.

ModelInfer: the tensors (typed ``contents`` or ``raw_input_contents``, checked against shape and datatype) reach the
handler as the v2 JSON request, one item of the model's dynamic batch:
``{"id", "parameters", "inputs": [{"name", "datatype", "shape", "data": [flat, row-major]}], "outputs"}`` (BYTES
elements as text, base64 when they are not UTF-8). The handler answers a v2 response (``{"outputs": [...]}``), or
any other answer, which becomes the single output ``output-0`` (a JSON list: a tensor of its type and shape; a
JSON object or non-JSON bytes: one BYTES element). The answer is raw when the request was.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import grpc
import numpy as np

import servetune
from servetune._exceptions import ApiError
from servetune.api.grpc.calls import Served, infer_request, send_timing, version_or_none
from servetune.api.grpc.status import unary
from servetune.api.grpc.tensors import (
    Tensor,
    datatype_of,
    fill_contents,
    from_contents,
    from_raw,
    to_array,
    to_raw,
)
from servetune.api.grpc.torchserve import answer_error
from servetune.api.types import InferResult, Input
from servetune.protos import OIP, methods

_METHODS = methods(OIP)
LiveResponse = _METHODS["ServerLive"].response
ReadyResponse = _METHODS["ServerReady"].response
ModelReadyResponse = _METHODS["ModelReady"].response
ServerMetadataResponse = _METHODS["ServerMetadata"].response
ModelMetadataResponse = _METHODS["ModelMetadata"].response
InferResponse = _METHODS["ModelInfer"].response
SERVER_NAME = "servetune"
DEFAULT_OUTPUT = "output-0"


def parameters(params: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(value, choice)
    return out


def decode_inputs(request: Any) -> list[Tensor]:
    raw = list(request.raw_input_contents)
    if raw:
        if any(t.HasField("contents") for t in request.inputs):
            raise ApiError.bad_request("contents must not be set on any input when raw_input_contents is used")
        if len(raw) != len(request.inputs):
            raise ApiError.bad_request(
                f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs (one per input)"
            )
        return [from_raw(t.name, t.datatype, t.shape, r) for t, r in zip(request.inputs, raw, strict=True)]
    return [from_contents(t.name, t.datatype, t.shape, t.contents) for t in request.inputs]


def _json_data(tensor: Tensor) -> list[Any]:
    flat = np.asarray(tensor.data).reshape(-1)
    if tensor.datatype != "BYTES":
        values: list[Any] = flat.tolist()
        return values
    out = []
    for item in flat:
        try:
            out.append(bytes(item).decode("utf-8"))
        except UnicodeDecodeError:
            out.append(base64.b64encode(bytes(item)).decode("ascii"))
    return out


def handler_body(request: Any, tensors: list[Tensor]) -> bytes:
    """The v2 JSON request the handler receives."""
    body: dict[str, Any] = {
        "inputs": [
            {"name": t.name, "shape": list(t.shape), "datatype": t.datatype, "data": _json_data(t)} for t in tensors
        ]
    }
    if request.id:
        body["id"] = request.id
    if request.parameters:
        body["parameters"] = parameters(request.parameters)
    if request.outputs:
        body["outputs"] = [{"name": o.name} for o in request.outputs]
    return json.dumps(body).encode()


def output_tensors(result: InferResult) -> list[Tensor]:
    """The handler's answer as output tensors (see the module's docstring)."""
    try:
        value = json.loads(result.body)
    except ValueError:
        data = np.empty(1, dtype=object)
        data[0] = result.body
        return [Tensor(DEFAULT_OUTPUT, "BYTES", (1,), data)]
    outputs = value.get("outputs") if isinstance(value, dict) else None
    if not isinstance(outputs, list):
        if isinstance(value, dict):  # not a tensor: its JSON text, one BYTES element
            data = np.empty(1, dtype=object)
            data[0] = json.dumps(value).encode()
            return [Tensor(DEFAULT_OUTPUT, "BYTES", (1,), data)]
        outputs = [{"name": DEFAULT_OUTPUT, "data": value}]
    tensors = []
    for i, out in enumerate(outputs):
        if not isinstance(out, dict) or "data" not in out:
            raise ApiError.internal(f"the handler's output {i} is not a v2 output tensor (name, datatype, shape, data)")
        name = str(out.get("name") or f"output-{i}")
        array = np.asarray(out["data"], dtype=object if _textual(out["data"]) else None)
        datatype = str(out.get("datatype") or datatype_of(array))
        shape = out.get("shape")
        shape = list(array.shape) if shape is None else shape
        tensors.append(
            Tensor(name, datatype, tuple(int(d) for d in shape), to_array(name, datatype, shape, out["data"]))
        )
    return tensors


def _textual(data: Any) -> bool:
    """Data holding strings (BYTES), which numpy would otherwise turn into fixed-width unicode."""
    while isinstance(data, list) and data:
        data = data[0]
    return isinstance(data, (str, bytes))


class OipService:
    """``inference.GRPCInferenceService``."""

    def __init__(self, served: Served) -> None:
        self.served = served

    @unary
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802 - RPC names
        await self.served.authorize(context, "ping")
        return LiveResponse(live=True)

    @unary
    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self.served.authorize(context, "ping")
        return ReadyResponse(ready=await self.served.healthy())

    @unary
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self.served.authorize(context, "ping")
        try:
            ready = await self.served.backend.ready(request.name, version_or_none(request.version))
        except ApiError as exc:
            if exc.status == 404 and self.served.readiness.starting:
                ready = False  # it may be a start-up model still loading
            else:
                raise
        return ModelReadyResponse(ready=ready)

    @unary
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self.served.authorize(context, "inference")
        return ServerMetadataResponse(name=SERVER_NAME, version=servetune.__version__, extensions=[])

    @unary
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await self.served.authorize(context, "inference")
        refs = self.served.management.versions(request.name, version_or_none(request.version))
        versions = [r.version for r in self.served.backend.models() if r.name == request.name]
        response = ModelMetadataResponse(name=request.name, versions=versions, platform="")
        response.properties["version"] = refs[0].version
        return response

    @unary
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        served = self.served
        await served.authorize(context, "inference")
        name, version = request.model_name, version_or_none(request.model_version)
        if not name:
            raise ApiError.bad_request("model_name is required")
        tensors = decode_inputs(request)
        job = infer_request(context, [Input("body", "application/json", handler_body(request, tensors))])
        start = time.perf_counter()
        try:
            result = await served.backend.infer(name, version, job)
        except ApiError as exc:
            if exc.status == 404 and served.readiness.starting:
                exc = ApiError.unavailable(f"Model {name} is not loaded yet: the server is loading its start-up models")
            served.observe(name, version, None, exc.status, start)
            raise exc from None
        served.observe(name, version, result, result.status, start)
        if result.status >= 300:
            raise answer_error(result)
        response = self.response(request, result, raw=bool(request.raw_input_contents))
        send_timing(context, result)
        return response

    def response(self, request: Any, result: InferResult, raw: bool) -> Any:
        outputs = output_tensors(result)
        if request.outputs:
            wanted = [o.name for o in request.outputs]
            known = {t.name: t for t in outputs}
            missing = [w for w in wanted if w not in known]
            if missing:
                raise ApiError.bad_request(f"requested outputs {missing} are not among the model's {sorted(known)}")
            outputs = [known[w] for w in wanted]
        response = InferResponse(model_name=request.model_name, model_version=result.version, id=request.id)
        raw = raw or any(t.datatype in ("FP16", "BF16") for t in outputs)  # raw for one output: raw for all
        for tensor in outputs:
            out = response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
            if raw:
                response.raw_output_contents.append(to_raw(tensor.datatype, tensor.data))
            else:
                fill_contents(out.contents, tensor.datatype, tensor.data)
        limit = self.served.config.max_response_size
        size = response.ByteSize()
        if size > limit:
            raise ApiError.response_too_large(size, limit)
        return response


__all__ = ["OipService", "decode_inputs", "handler_body", "output_tensors"]
