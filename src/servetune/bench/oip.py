"""Load on an Open Inference Protocol v2 REST endpoint (``/v2/models/{name}/infer``): ``--engine oip-json`` sends
every request as JSON, ``--engine oip-binary`` with the binary tensor data extension (inputs in binary, every output
asked for in binary, as Triton's client does by default). The built-in engine's loops, results and report, with
requests built once before the run from each input file:

- ``.json`` holding an OIP request (``{"inputs": [...]}``): that request;
- ``.npy``: one input named ``input-0`` (TorchServe's kservev2 convention), its datatype the array's;
- any other file: one BYTES input ``input-0`` of shape ``[1]`` holding the file.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from servetune._exceptions import BenchError
from servetune.bench.async_engine import AsyncEngine
from servetune.bench.engines import RunHooks
from servetune.bench.http11 import Http11Pool, encode_request
from servetune.bench.payload import Payload
from servetune.bench.recording import Recording
from servetune.bench.sender import RequestSender
from servetune.bench.spec import BenchSpec
from servetune.tensors import (
    HEADER_LENGTH,
    InferenceRequest,
    Tensor,
    TensorError,
    parse_request,
)
from servetune.tensors import (
    encode_request as encode_oip,
)

INPUT_NAME = "input-0"


def oip_request(payload: Payload) -> InferenceRequest:
    """The inference request an input file stands for (see the module docstring)."""
    name = payload.name.lower()
    try:
        if name.endswith(".json"):
            return parse_request(payload.body)
        if name.endswith(".npy"):
            return InferenceRequest([Tensor.from_array(INPUT_NAME, np.load(io.BytesIO(payload.body)))])
        raw = np.empty(1, dtype=object)
        raw[0] = payload.body
        return InferenceRequest([Tensor.from_array(INPUT_NAME, raw, "BYTES")])
    except (TensorError, ValueError) as exc:
        raise BenchError(f"input {payload.name!r}: not an inference request: {exc}") from None


def oip_body(payload: Payload, binary: bool) -> tuple[bytes, list[tuple[str, str]]]:
    """The body and the headers of one request."""
    request = oip_request(payload)
    if not binary:
        body, _ = encode_oip(request, binary=False)
        return body, [("Content-Type", "application/json")]
    request.parameters = {**request.parameters, "binary_data_output": True}
    body, header_length = encode_oip(request, binary=True)
    return body, [("Content-Type", "application/octet-stream"), (HEADER_LENGTH, str(header_length))]


class _OipSender(RequestSender):
    def __init__(self, pool: Http11Pool, spec: BenchSpec, payloads: Sequence[Payload], binary: bool) -> None:
        self.pool = pool
        self.warnings: list[str] = []
        self.requests = []
        given = [(k, v) for k, v in spec.headers if k.lower() not in ("content-type", HEADER_LENGTH.lower())]
        for payload in payloads:
            body, headers = oip_body(payload, binary)
            self.requests.append(encode_request("POST", spec.url, given + headers, body))


class OipJsonEngine(AsyncEngine):
    """``--engine oip-json``: OIP v2 REST requests as JSON."""

    name = "oip-json"
    binary = False

    async def run(self, spec: BenchSpec, payloads: Sequence[Payload], hooks: RunHooks) -> Recording:
        if spec.method.upper() != "POST":
            raise BenchError(f"method={spec.method}: an inference request is a POST")
        limit = spec.clients if spec.mode == "closed" else spec.max_connections
        pool = Http11Pool(spec.url, limit, spec.timeout)
        sender = _OipSender(pool, spec, payloads, self.binary)
        try:
            if spec.mode == "closed":
                return await self._closed(spec, sender, hooks)
            return await self._open(spec, sender, hooks)
        finally:
            pool.close()


class OipBinaryEngine(OipJsonEngine):
    """``--engine oip-binary``: OIP v2 REST requests with the binary tensor data extension."""

    name = "oip-binary"
    binary = True


__all__ = ["INPUT_NAME", "OipBinaryEngine", "OipJsonEngine", "oip_body", "oip_request"]
