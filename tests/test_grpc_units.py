"""The gRPC pieces without a server: the compiled protos are fresh and field for field, tensors decode and encode
(raw BYTES framing, BF16, the checks that make bad input INVALID_ARGUMENT), HTTP statuses map to gRPC codes, the
intermediate-answer message survives the wire, and the gRPC config keys validate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from servetune._exceptions import ApiError, ConfigError
from servetune.api.grpc.oip import decode_request
from servetune.api.grpc.status import code_for
from servetune.config.server import ServerConfig
from servetune.protos import OIP, TORCHSERVE_INFERENCE, TORCHSERVE_MANAGEMENT, message, methods
from servetune.server.messages import Answer, Partial, decode, decode_message

ROOT = Path(__file__).resolve().parents[1]


def test_the_compiled_protos_match_the_proto_files() -> None:
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_protos"), "--check"], capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_the_services_have_the_published_rpcs_and_field_numbers() -> None:
    assert list(methods(OIP)) == [
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
    ]
    stream = methods(TORCHSERVE_INFERENCE)["StreamPredictions"]
    assert (stream.client_streaming, stream.server_streaming) == (False, True)
    assert set(methods(TORCHSERVE_MANAGEMENT)) == {
        "DescribeModel",
        "ListModels",
        "RegisterModel",
        "ScaleWorker",
        "SetDefault",
        "UnregisterModel",
    }
    register = message("org.pytorch.serve.grpc.management.RegisterModelRequest").DESCRIPTOR
    assert {f.name: f.number for f in register.fields} == {
        "batch_size": 1,
        "handler": 2,
        "initial_workers": 3,
        "max_batch_delay": 4,
        "model_name": 5,
        "response_timeout": 6,
        "runtime": 7,
        "synchronous": 8,
        "url": 9,
        "s3_sse_kms": 10,
        "startup_timeout": 11,
    }
    infer = message("inference.ModelInferRequest").DESCRIPTOR
    assert {f.name: f.number for f in infer.fields} == {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "inputs": 5,
        "outputs": 6,
        "raw_input_contents": 7,
    }
    contents = message("inference.InferTensorContents").DESCRIPTOR
    assert [f.name for f in contents.fields] == [
        "bool_contents",
        "int_contents",
        "int64_contents",
        "uint_contents",
        "uint64_contents",
        "fp32_contents",
        "fp64_contents",
        "bytes_contents",
    ]


def infer(datatype: str, shape: list[int], raw: bytes | None = None, **contents: list) -> object:  # type: ignore[type-arg]
    request = message("inference.ModelInferRequest")(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return request


def test_typed_and_raw_inputs_decode_to_the_same_tensors() -> None:
    typed = decode_request(infer("FP32", [2, 2], fp32_contents=[0, 1, 2, 3]))
    raw = decode_request(infer("FP32", [2, 2], raw=np.arange(4, dtype="<f4").tobytes()))
    assert typed.inputs[0].data.tolist() == raw.inputs[0].data.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    framed = b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x01\x00\x00\x00\xff"
    assert decode_request(infer("BYTES", [3], raw=framed)).inputs[0].data.tolist() == [b"ab", b"", b"\xff"]
    assert decode_request(infer("BYTES", [3], bytes_contents=[b"ab", b"", b"\xff"])).inputs[0].data.tolist() == [
        b"ab",
        b"",
        b"\xff",
    ]


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (infer("FP32", [3], raw=b"\0" * 8), "x"),
        (infer("FLOAT", [1], raw=b"\0" * 4), "FLOAT"),
        (infer("BYTES", [2], raw=b"\x01\x00\x00\x00a"), "x"),
        (infer("BYTES", [1], raw=b"\x05\x00\x00\x00ab"), "truncated"),
        (infer("FP32", [2], int_contents=[1, 2]), "takes fp32_contents, got int_contents"),
        (infer("INT32", [3], int_contents=[1, 2]), "holds 3 elements"),
        (infer("FP16", [1], fp32_contents=[1.0]), "only in raw_input_contents"),
        (infer("FP32", [-1], fp32_contents=[1.0]), "negative dimension"),
        (infer("FP32", [1], raw=b"\0" * 4, fp32_contents=[1.0]), "contents must not be set"),
    ],
)
def test_malformed_inputs_are_the_callers_error(request_: object, says: str) -> None:
    with pytest.raises(ApiError) as info:
        decode_request(request_)
    assert info.value.status == 400 and says in info.value.message, info.value.message


def test_http_statuses_map_to_grpc_codes() -> None:
    assert code_for(400) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_for(404) == grpc.StatusCode.NOT_FOUND
    assert code_for(405) == grpc.StatusCode.FAILED_PRECONDITION
    assert code_for(503) == grpc.StatusCode.UNAVAILABLE
    assert code_for(504) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert code_for(507) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code_for(500) == grpc.StatusCode.INTERNAL


def test_an_intermediate_answer_survives_the_worker_wire() -> None:
    frame = Partial("r1", Answer(200, b"part", "text/plain", {"k": "v"})).encode()
    header, blobs = decode(frame[4:])
    decoded = decode_message(header, blobs)
    assert decoded == Partial("r1", Answer(200, b"part", "text/plain", {"k": "v"}))


def test_grpc_config_keys() -> None:
    config = ServerConfig.from_properties(
        {
            "grpc_inference_address": "0.0.0.0",
            "grpc_inference_port": "8081",
            "grpc_management_port": "0",
            "grpc_inference_max_connection_age_ms": "60000",
            "enable_grpc_ssl": "false",
        }
    )
    assert (config.grpc_inference_address, config.grpc_inference_port, config.grpc_management_port) == (
        "0.0.0.0",
        8081,
        0,
    )
    assert config.grpc_inference_max_connection_age_ms == 60000
    with pytest.raises(ConfigError, match="enable_grpc_ssl='true': TLS on gRPC is not supported"):
        ServerConfig.from_properties({"enable_grpc_ssl": "true"})
    with pytest.raises(ConfigError, match="grpc_management_port"):
        ServerConfig.from_properties({"grpc_management_port": "70000"})
    with pytest.raises(ConfigError, match="grpc_inference_address"):
        ServerConfig.from_properties({"grpc_inference_address": "http://x:1/"})
