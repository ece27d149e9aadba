"""The Open Inference Protocol (KServe v2) gRPC service, ``inference.GRPCInferenceService``, on the inference gRPC
port beside TorchServe's service (as TorchServe 0.10+ serves it), over any backend.

ModelInfer takes the same transport-neutral path as OIP REST (``servetune.api.oip``): the proto becomes a
:class:`~servetune.tensors.InferenceRequest` (typed ``contents`` or ``raw_input_contents``, checked against shape and
datatype: INVALID_ARGUMENT naming the tensor), one item of the model's dynamic batch; the worker's envelope hands it
to the handler (``kservev2``, or servetune's ``tensors`` form) and answers every output in binary; the outputs go
back raw when the request was raw (and for FP16/BF16), else as typed contents.

Readiness is the gateway's (``servetune.api.gateway``): ServerReady is REST ``/ping``'s rule, ModelReady the model's
minimum of workers; while the start-up models load, ModelReady of a model not registered yet is false, not
NOT_FOUND.
"""

from __future__ import annotations

import struct
from typing import Any

import grpc

import servetune
from servetune._exceptions import ApiError
from servetune.api import oip
from servetune.api.gateway import INFERENCE, PROBE, Call, Caller, Gateway
from servetune.api.grpc.calls import handler_headers, rpc, send_timing, version_or_none
from servetune.api.offload import off_loop
from servetune.protos import CONTENTS_FIELDS, OIP, methods
from servetune.tensors import (
    DEFAULT_LIMITS,
    InferenceRequest,
    RequestedOutput,
    Tensor,
    TensorError,
    TensorLimits,
    decode_binary_data,
    decode_json_data,
)

_METHODS = methods(OIP)
LiveResponse = _METHODS["ServerLive"].response
ReadyResponse = _METHODS["ServerReady"].response
ModelReadyResponse = _METHODS["ModelReady"].response
ServerMetadataResponse = _METHODS["ServerMetadata"].response
ModelMetadataResponse = _METHODS["ModelMetadata"].response
InferResponse = _METHODS["ModelInfer"].response
SERVER_NAME = "servetune"
_USED = tuple(sorted({f for f in CONTENTS_FIELDS.values() if f}))
_LENGTH = struct.Struct("<I")


def parameters(params: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(value, choice)
    return out


def typed_tensor(tensor: Any, limits: TensorLimits = DEFAULT_LIMITS) -> Tensor:
    """An input from its typed ``contents``: in its datatype's field only, as many elements as the shape holds."""
    name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
    limits.check(name, shape)
    if datatype not in CONTENTS_FIELDS:
        raise TensorError(f"input {name!r}: datatype={datatype!r}: expected one of {', '.join(CONTENTS_FIELDS)}")
    field = CONTENTS_FIELDS[datatype]
    if field is None:
        raise TensorError(f"input {name!r}: {datatype} travels only in raw_input_contents")
    others = [f for f in _USED if f != field and len(getattr(tensor.contents, f))]
    if others:
        raise TensorError(f"input {name!r}: datatype {datatype} takes {field}, got {', '.join(others)}")
    if any(d < 0 for d in shape):
        raise TensorError(f"input {name!r}: shape {shape} has a negative dimension")
    values = getattr(tensor.contents, field)
    count = 1
    for d in shape:
        count *= d
    if len(values) != count:
        raise TensorError(f"input {name!r}: shape {shape} holds {count} elements, {field} has {len(values)}")
    if datatype == "BYTES":
        packed = b"".join(_LENGTH.pack(len(v)) + v for v in values)
        return decode_binary_data(name, datatype, shape, packed, limits)
    return decode_json_data(name, datatype, shape, list(values), limits)


def decode_request(request: Any, limits: TensorLimits = DEFAULT_LIMITS) -> InferenceRequest:
    """A ``ModelInferRequest`` as the transport-neutral request; every shape checked against ``limits`` before its
    data is read (ApiError 400 for a malformed one, 413 over a limit)."""
    raw = list(request.raw_input_contents)
    try:
        if raw:
            if any(t.HasField("contents") for t in request.inputs):
                raise TensorError("contents must not be set on any input when raw_input_contents is used")
            if len(raw) != len(request.inputs):
                raise TensorError(f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs")
            inputs = [
                decode_binary_data(t.name, t.datatype, list(t.shape), r, limits)
                for t, r in zip(request.inputs, raw, strict=True)
            ]
        else:
            inputs = [typed_tensor(t, limits) for t in request.inputs]
        for tensor, sent in zip(inputs, request.inputs, strict=True):
            tensor.parameters = parameters(sent.parameters)
    except TensorError as exc:
        raise oip.tensor_error(exc) from None
    outputs = [RequestedOutput(o.name, parameters(o.parameters)) for o in request.outputs]
    return InferenceRequest(inputs, request.id or None, parameters(request.parameters), outputs)


def encode_outputs(response: Any, outputs: list[Tensor], raw: bool) -> None:
    raw = raw or any(t.datatype in ("FP16", "BF16") for t in outputs)  # raw for one output: raw for all
    for tensor in outputs:
        out = response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        if raw:
            response.raw_output_contents.append(tensor.to_bytes())
            continue
        field = CONTENTS_FIELDS[tensor.datatype]
        flat = tensor.data.reshape(-1)
        getattr(out.contents, str(field)).extend(list(flat) if tensor.datatype == "BYTES" else flat.tolist())


class OipService:
    """``inference.GRPCInferenceService``."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @rpc(PROBE)
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        return LiveResponse(live=True)

    @rpc(PROBE)
    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        return ReadyResponse(ready=await self.gateway.server_ready())

    @rpc(PROBE)
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        return ModelReadyResponse(ready=await self.gateway.model_ready(request.name, version_or_none(request.version)))

    @rpc(PROBE)
    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        return ServerMetadataResponse(name=SERVER_NAME, version=servetune.__version__, extensions=[])

    @rpc(PROBE)
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        found = await self.gateway.metadata(request.name, version_or_none(request.version))
        response = ModelMetadataResponse(name=found.name, versions=list(found.versions), platform=found.platform)
        for kind, tensors in (("inputs", found.inputs), ("outputs", found.outputs)):
            for t in tensors:
                getattr(response, kind).add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        return response

    @rpc(INFERENCE)
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext, who: Caller) -> Any:  # noqa: N802
        gateway = self.gateway
        name, version = request.model_name, version_or_none(request.model_version)
        if not name:
            raise ApiError.bad_request("model_name is required")
        headers = handler_headers(context)

        def call() -> Call:  # decoded and encoded for the worker: on a thread for a large request
            decoded = decode_request(request, gateway.config.tensor_limits)
            return oip.oip_call(decoded, name, version, headers, all_binary=True)

        answer = await gateway.infer(await off_loop(request.ByteSize(), call), who)
        result = answer.result

        def response() -> Any:
            decoded = oip.infer_response(result)
            encoded = InferResponse(
                model_name=name, model_version=result.version or decoded.model_version or "", id=request.id
            )
            encode_outputs(encoded, decoded.outputs, raw=bool(request.raw_input_contents))
            return encoded

        encoded = await off_loop(len(result.body), response)
        gateway.check_answer_size(encoded.ByteSize())  # typed contents can be larger than the worker's answer
        send_timing(context, answer)
        return encoded


__all__ = ["OipService", "decode_request", "encode_outputs"]
