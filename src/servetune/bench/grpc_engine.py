"""The gRPC engine (``--engine grpc``): the built-in engine's closed and open loops, over gRPC instead of HTTP/1.1.

The URL names the gRPC port and, as a REST path, the call to make (gRPC is HTTP/2, so ``http://`` is its scheme):

    http://HOST:7070/predictions/MODEL[/VERSION]               TorchServe's Predictions, the body as input "data"
    http://HOST:7070/v2/models/MODEL[/versions/V]/infer        the Open Inference Protocol's ModelInfer

For ModelInfer a body that is a v2 JSON request (``{"inputs": [{"name", "datatype", "shape", "data"}]}``) is sent
as typed tensors; any other body as one BYTES tensor ``input-0``. Requests are serialized once, before the run;
answers are not parsed, only their status and the server's timing (trailing metadata). Channels: one HTTP/2
connection per 32 concurrent requests (gRPC multiplexes calls on a connection), each a subchannel of its own.

Its ceiling is Python gRPC's: about 3,000-5,000 requests per client core (benchmarks/grpc_engine_ceiling.py), a
tenth of the HTTP engine's; the client CPU it reports counts gRPC's own threads, so a run it limits is flagged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import resource
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import grpc

from servetune._exceptions import BenchError
from servetune.bench.async_engine import AsyncEngine
from servetune.bench.engines import RunHooks
from servetune.bench.payload import Payload
from servetune.bench.recording import CONNECTION, TIMEOUT, Recording
from servetune.bench.sender import Sent
from servetune.bench.spec import BenchSpec
from servetune.protos import CONTENTS_FIELDS, OIP, TORCHSERVE_INFERENCE, methods
from servetune.timing import read_timing

_PREDICTIONS = re.compile(r"^/predictions/([^/]+)(?:/([^/]+))?/?$")
_V2_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer/?$")
CALLS_PER_CHANNEL = 32
_NAN = math.nan
# gRPC codes as the HTTP statuses the recording counts (its failure table reads HTTP statuses)
_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
}


def v2_request(body: bytes, model: str, version: str) -> Any:
    """A ``ModelInferRequest`` from a v2 JSON request body, or one BYTES input holding the body."""
    request = methods(OIP)["ModelInfer"].request(model_name=model, model_version=version)
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not (isinstance(parsed, dict) and isinstance(parsed.get("inputs"), list)):
        request.inputs.add(name="input-0", datatype="BYTES", shape=[1]).contents.bytes_contents.append(body)
        return request
    for item in parsed["inputs"]:
        datatype = str(item.get("datatype", ""))
        field = CONTENTS_FIELDS.get(datatype)
        if field is None:
            raise BenchError(f"input {item.get('name')!r}: datatype {datatype!r} cannot be sent as typed contents")
        tensor = request.inputs.add(name=str(item["name"]), datatype=datatype, shape=[int(d) for d in item["shape"]])
        data = _flat(item.get("data", []))
        if datatype == "BYTES":
            data = [d.encode() if isinstance(d, str) else bytes(d) for d in data]
        getattr(tensor.contents, field).extend(data)
    if parsed.get("id"):
        request.id = str(parsed["id"])
    return request


def _flat(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    return [x for item in data for x in _flat(item)]


def call_for(spec: BenchSpec, payloads: Sequence[Payload]) -> tuple[str, list[bytes]]:
    """The RPC's path and each payload's serialized request."""
    path = urlsplit(spec.url).path
    if match := _PREDICTIONS.match(path):
        method = methods(TORCHSERVE_INFERENCE)["Predictions"]
        model, version = match.group(1), match.group(2) or ""
        requests = [method.request(model_name=model, model_version=version, input={"data": p.body}) for p in payloads]
    elif match := _V2_INFER.match(path):
        method = methods(OIP)["ModelInfer"]
        requests = [v2_request(p.body, match.group(1), match.group(2) or "") for p in payloads]
    else:
        raise BenchError(
            f"url={spec.url!r}: the gRPC engine calls /predictions/MODEL[/VERSION] (TorchServe's Predictions) or "
            "/v2/models/MODEL[/versions/V]/infer (OIP ModelInfer) on the gRPC port"
        )
    return method.path, [r.SerializeToString() for r in requests]


class _GrpcSender:
    """Sends request ``i`` over one of a few channels; returns (status, queue ms, handler ms, batch size, ())."""

    def __init__(self, spec: BenchSpec, payloads: Sequence[Payload], concurrency: int) -> None:
        parts = urlsplit(spec.url)
        target = f"{parts.hostname}:{parts.port or 80}"
        path, self.bodies = call_for(spec, payloads)
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1)]
        count = max(1, math.ceil(concurrency / CALLS_PER_CHANNEL))
        self.channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(count)]
        # no (de)serializers: the requests are bytes already and the answers are not read
        self.calls = [channel.unary_unary(path) for channel in self.channels]
        self.metadata = tuple((k.lower(), v) for k, v in spec.headers if k.lower() != "content-type")
        self.timeout = spec.timeout
        self.warnings: list[str] = []

    async def send(self, i: int) -> Sent:
        call = self.calls[i % len(self.calls)](
            self.bodies[i % len(self.bodies)], timeout=self.timeout, metadata=self.metadata or None
        )
        try:
            await call
            trailing = dict(await call.trailing_metadata() or ())
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return TIMEOUT, _NAN, _NAN, 0, ()
            if code == grpc.StatusCode.UNAVAILABLE and "connect" in (exc.details() or "").lower():
                return CONNECTION, _NAN, _NAN, 0, ()
            return _STATUS.get(code, 500), _NAN, _NAN, 0, ()
        return 200, *read_timing(trailing), ()

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


class GrpcEngine(AsyncEngine):
    """``--engine grpc``."""

    name = "grpc"

    async def run(self, spec: BenchSpec, payloads: Sequence[Payload], hooks: RunHooks) -> Recording:
        concurrency = spec.clients if spec.mode == "closed" else spec.max_connections
        sender = _GrpcSender(spec, payloads, concurrency)
        # gRPC works on threads of its own too: count the process's CPU over the measured part, not the loop's
        cpu: list[float] = []

        async def start() -> None:
            cpu.append(_process_cpu())
            await hooks.measure_start()

        async def end() -> None:
            cpu.append(_process_cpu())
            await hooks.measure_end()

        timed = dataclasses.replace(hooks, measure_start=start, measure_end=end)
        try:
            if spec.mode == "closed":
                rec = await self._closed(spec, sender, timed)
            else:
                rec = await self._open(spec, sender, timed)
        finally:
            await sender.close()
        if len(cpu) == 2:
            rec.cpu_seconds = max(rec.cpu_seconds, cpu[1] - cpu[0])
        return rec


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


__all__ = ["GrpcEngine", "call_for", "v2_request"]
