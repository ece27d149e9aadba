"""Structured fuzzing of the wire formats on a real server (issue 19): Hypothesis builds OIP v2 requests (JSON and the
binary tensor extension), gRPC ``ModelInferRequest`` and ``PredictionsRequest`` messages, raw protobuf bytes and
request heads, valid and invalid alike (shapes with negative, huge and many dimensions, every datatype and some that
are not, NaN, lone surrogates, wrong lengths, control headers). Every answer must be one the protocol documents for
bad input (400/413/431, INVALID_ARGUMENT/RESOURCE_EXHAUSTED/NOT_FOUND) or a success; never a 5xx, UNKNOWN or
INTERNAL, never a dropped connection; and the server still serves afterwards.

Bounded for CI: a fixed number of examples per wire format, derandomized (the same examples on every run), one
server for the file (about 20 s in all).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from http_client import call
from models import handler_archive
from servetune.embedded import EmbeddedServer
from servetune.protos import CONTENTS_FIELDS, OIP, TORCHSERVE_INFERENCE, methods
from servetune.tensors import DATATYPES

HANDLER = textwrap.dedent(
    """
    def handle(data, context):
        if data is None:
            return None
        return [[len(str(row.get("data") if isinstance(row, dict) else row))] for row in data]
    """
)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
REST_OK = {200, 400, 413}
GRPC_OK = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("store")
    handler_archive(store, "probe", "probe_handler.py", HANDLER, {"batchSize": 4, "maxBatchDelay": 1})
    properties = {"default_workers_per_model": "1", "disable_token_authorization": "true"}
    running = EmbeddedServer(store, {"probe": "probe.mar"}, properties, workdir=tmp_path_factory.mktemp("server"))
    running.start()
    try:
        yield running
    finally:
        assert call("GET", f"{running.inference_url}/ping").status == 200  # still serving after every example
        running.stop()


# ---- strategies ----------------------------------------------------------------------------------------------------

datatypes = st.sampled_from([*DATATYPES, "FP8", "", "int32"])
dims = st.one_of(st.integers(-3, 4), st.sampled_from([0, 10**7, 10**19, 2**63 - 1, -(2**63)]))
shapes = st.one_of(st.lists(dims, max_size=5), st.just([1] * 65))
scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(width=64),  # NaN and infinities included: not JSON once dumped
    st.booleans(),
    st.text(max_size=4),
    st.sampled_from(["\ud800", "\udfff"]),  # lone surrogates: valid JSON escapes, no Unicode text
    st.none(),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=16)
names = st.text(max_size=4)
parameters = st.dictionaries(names, scalars, max_size=2)


@st.composite
def tensors(draw: st.DrawFn, binary: bool = False) -> dict[str, Any]:
    raw: dict[str, Any] = {"name": draw(st.one_of(names, st.just("x"))), "shape": draw(shapes),
                           "datatype": draw(datatypes)}
    if binary:
        raw["parameters"] = {"binary_data_size": draw(st.one_of(st.integers(-2, 40), st.just(10**12)))}
    elif draw(st.booleans()):
        raw["data"] = draw(values)
    if draw(st.booleans()):
        raw.setdefault("parameters", {}).update(draw(parameters))
    return raw


@st.composite
def oip_bodies(draw: st.DrawFn, binary: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": draw(st.lists(tensors(binary), max_size=3))}
    if draw(st.booleans()):
        body["id"] = draw(st.one_of(names, st.integers()))
    if draw(st.booleans()):
        body["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": names}), max_size=2))
    if draw(st.booleans()):
        body["parameters"] = draw(parameters)
    return body


def typed_values(field: str) -> st.SearchStrategy[list[Any]]:
    by_field: dict[str, st.SearchStrategy[Any]] = {
        "bool_contents": st.booleans(),
        "int_contents": st.integers(-(2**31), 2**31 - 1),
        "int64_contents": st.integers(-(2**63), 2**63 - 1),
        "uint_contents": st.integers(0, 2**32 - 1),
        "uint64_contents": st.integers(0, 2**64 - 1),
        "fp32_contents": st.floats(width=32),
        "fp64_contents": st.floats(),
        "bytes_contents": st.binary(max_size=8),
    }
    return st.lists(by_field[field], max_size=6)


CONTENT_FIELDS = sorted({f for f in CONTENTS_FIELDS.values() if f})
grpc_dims = st.one_of(st.integers(-3, 4), st.sampled_from([0, 10**7, 2**63 - 1, -(2**63)]))


@st.composite
def model_infer_requests(draw: st.DrawFn) -> Any:
    request = methods(OIP)["ModelInfer"].request(model_name=draw(st.sampled_from(["probe", "probe", "", "nope"])))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(name=draw(names), datatype=draw(datatypes),
                                    shape=draw(st.lists(grpc_dims, max_size=5)))
        if not raw and draw(st.booleans()):
            field = draw(st.sampled_from(CONTENT_FIELDS))
            getattr(tensor.contents, field).extend(draw(typed_values(field)))
    if raw:
        request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=24), max_size=3)))
    return request


# ---- OIP v2 over REST ----------------------------------------------------------------------------------------------


def oip_post(server: EmbeddedServer, body: bytes, headers: dict[str, str]) -> None:
    reply = call("POST", f"{server.inference_url}/v2/models/probe/infer", body, headers, timeout=60)
    assert reply.status in REST_OK, (reply.status, body[:300], reply.body[:300])
    if reply.status != 200:
        assert list(json.loads(reply.body)) == ["error"], reply.body[:300]


@FUZZ
@given(body=oip_bodies())
def test_oip_json_requests(server: EmbeddedServer, body: dict[str, Any]) -> None:
    oip_post(server, json.dumps(body).encode(), {"Content-Type": "application/json"})


@FUZZ
@given(body=oip_bodies(binary=True), tail=st.binary(max_size=64), skew=st.sampled_from([0, 0, -1, 1, 10**6]),
       length=st.sampled_from(["", "\u00b2", "-1", "9" * 40, " 1 "]))
def test_oip_binary_requests(server: EmbeddedServer, body: dict[str, Any], tail: bytes, skew: int,
                             length: str) -> None:
    head = json.dumps(body).encode()
    header_length = length or str(max(0, len(head) + skew))
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": header_length}
    oip_post(server, head + tail, headers)


@settings(FUZZ, max_examples=60)
@given(body=st.binary(max_size=200))
def test_arbitrary_bytes_to_every_inference_route(server: EmbeddedServer, body: bytes) -> None:
    for path, allowed in (("/v2/models/probe/infer", REST_OK), ("/v1/models/probe:predict", {200, 400}),
                          ("/predictions/probe", {200, 400})):
        reply = call("POST", f"{server.inference_url}{path}", body, {"Content-Type": "application/json"})
        assert reply.status in allowed, (path, reply.status, body[:100], reply.body[:300])


# ---- request heads -------------------------------------------------------------------------------------------------

header_names = st.one_of(
    st.sampled_from(["explain", "describe", "x-servetune-protocol", "Inference-Header-Content-Length",
                     "content-encoding", "x-request-id"]),
    st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True),
)
header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                        max_size=40).map(str.strip)


@settings(FUZZ, max_examples=40)
@given(headers=st.dictionaries(header_names, header_values, max_size=110))
def test_request_heads_with_any_headers(server: EmbeddedServer, headers: dict[str, str]) -> None:
    body = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}'
    sent = {**headers, "Content-Type": "application/json"}
    for path in ("/v2/models/probe/infer", "/predictions/probe"):
        reply = call("POST", f"{server.inference_url}{path}", body, sent)
        assert reply.status in {200, 400, 413, 415, 431}, (path, reply.status, reply.body[:300])
        if len(sent) > 100:
            assert reply.status == 431


# ---- gRPC ----------------------------------------------------------------------------------------------------------


def grpc_code(server: EmbeddedServer, service: str, rpc: str, request: Any,
              metadata: tuple[tuple[str, str], ...] = ()) -> tuple[grpc.StatusCode, str]:
    method = methods(service)[rpc]
    with grpc.insecure_channel(server.grpc_inference_target) as channel:
        stub = channel.unary_unary(method.path, request_serializer=lambda m: m if isinstance(m, bytes)
                                   else m.SerializeToString(), response_deserializer=method.response.FromString)
        try:
            stub(request, metadata=metadata, timeout=60)
        except grpc.RpcError as exc:
            return exc.code(), str(exc.details())
    return grpc.StatusCode.OK, ""


@FUZZ
@given(request=model_infer_requests())
def test_grpc_model_infer_messages(server: EmbeddedServer, request: Any) -> None:
    code, details = grpc_code(server, OIP, "ModelInfer", request)
    assert code in GRPC_OK, (code, details, request)


@FUZZ
@given(raw=st.binary(max_size=120), rpc=st.sampled_from([(OIP, "ModelInfer"), (TORCHSERVE_INFERENCE, "Predictions"),
                                                       (OIP, "ModelMetadata")]))
def test_grpc_arbitrary_bytes(server: EmbeddedServer, raw: bytes, rpc: tuple[str, str]) -> None:
    code, details = grpc_code(server, *rpc, raw)
    assert code in GRPC_OK, (code, details, raw)


@settings(FUZZ, max_examples=60)
@given(inputs=st.dictionaries(names, st.binary(max_size=16), max_size=3),
       metadata=st.lists(st.tuples(st.sampled_from(["explain", "describe", "x-servetune-protocol", "x-a"]),
                                   st.sampled_from(["True", "oip-metadata", "kserve-v1", ""])), max_size=3))
def test_grpc_predictions_messages(server: EmbeddedServer, inputs: dict[str, bytes],
                                   metadata: list[tuple[str, str]]) -> None:
    request = methods(TORCHSERVE_INFERENCE)["Predictions"].request(model_name="probe", input=inputs)
    code, details = grpc_code(server, TORCHSERVE_INFERENCE, "Predictions", request, tuple(metadata))
    assert code in GRPC_OK, (code, details, inputs, metadata)
