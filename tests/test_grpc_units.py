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
from servetune.api.grpc.status import code_for
from servetune.api.grpc.tensors import from_contents, from_raw, join_bytes, split_bytes, to_raw
from servetune.config.server import ServerConfig
from servetune.protos import OIP, TORCHSERVE_INFERENCE, TORCHSERVE_MANAGEMENT, message, methods
from servetune.server.messages import Answer, Partial, decode_message
from servetune.server.protocol import decode

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


def test_raw_tensors_decode_and_encode() -> None:
    floats = from_raw("x", "FP32", [2, 2], np.arange(4, dtype="<f4").tobytes())
    assert floats.data.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    framed = join_bytes([b"ab", b"", b"\xff"])
    assert framed == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x01\x00\x00\x00\xff"
    assert split_bytes("s", framed) == [b"ab", b"", b"\xff"]
    assert from_raw("s", "BYTES", [3], framed).data.tolist() == [b"ab", b"", b"\xff"]
    bf16 = from_raw("b", "BF16", [2], to_raw("BF16", np.array([1.5, -2.0], dtype="<f4")))
    assert bf16.data.tolist() == [1.5, -2.0]
    assert to_raw("BYTES", np.array([b"ab"], dtype=object)) == b"\x02\x00\x00\x00ab"


@pytest.mark.parametrize(
    ("datatype", "shape", "raw", "says"),
    [
        ("FP32", [3], b"\0" * 8, "needs 12 bytes"),
        ("FP32", [-1], b"", "negative dimension"),
        ("FLOAT", [1], b"\0" * 4, "unknown datatype"),
        ("BYTES", [2], b"\x01\x00\x00\x00a", "needs 2 elements"),
        ("BYTES", [1], b"\x05\x00\x00\x00ab", "runs past"),
        ("BYTES", [1], b"\x01\x00", "inside an element's length"),
    ],
)
def test_malformed_raw_tensors_are_the_callers_error(datatype: str, shape: list[int], raw: bytes, says: str) -> None:
    with pytest.raises(ApiError) as info:
        from_raw("x", datatype, shape, raw)
    assert info.value.status == 400 and says in info.value.message


def test_typed_contents_in_the_wrong_field_or_count_are_refused() -> None:
    contents = message("inference.InferTensorContents")(int_contents=[1, 2])
    assert from_contents("x", "INT32", [2], contents).data.tolist() == [1, 2]
    for datatype, shape, says in (
        ("FP32", [2], "takes fp32_contents"),
        ("INT32", [3], "needs 3 elements"),
        ("FP16", [2], "raw_input_contents"),
    ):
        with pytest.raises(ApiError, match=says):
            from_contents("x", datatype, shape, contents)


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
