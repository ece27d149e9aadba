"""The typed frontend <-> worker messages: every field survives the wire, and malformed frames are refused."""

from __future__ import annotations

import pytest

from servetune.api.types import InferRequest, Input
from servetune.handlers.control import KSERVE_V1, Control
from servetune.handlers.spec import CpuSettings, WorkerSpec
from servetune.server.messages import (
    Answer,
    Load,
    LoadError,
    Predict,
    ProtocolError,
    Ready,
    Result,
    decode,
    decode_message,
)


def _round_trip(frame: bytes) -> object:
    return decode_message(*decode(frame[4:]))


def test_predict_carries_requests_inputs_and_cpu_settings() -> None:
    requests = [
        InferRequest("a", {"h": "1"}, [Input("body", "image/png", b"\x89PNG"), Input("x", None, b"")], 0.0),
        InferRequest("b", {}, [Input("data", "text/plain", b"hi")], 0.0, control=Control(KSERVE_V1, explain=True)),
        InferRequest("c", {"describe": "True"}, [], 0.0, control=Control(describe=True)),
    ]
    back = _round_trip(Predict(requests, 4, 2, (0, 1)).encode())
    assert isinstance(back, Predict)
    assert (back.batch_size, back.num_threads, back.cpu_cores) == (4, 2, (0, 1))
    assert [(r.request_id, r.headers, r.inputs, r.control) for r in back.requests] == [
        (r.request_id, r.headers, r.inputs, r.control) for r in requests
    ]


def test_result_ready_and_load_error_round_trip() -> None:
    cpu = CpuSettings(2, 1, (0, 1))
    result = Result([Answer(200, b"ok", "text/plain", {"x": "y"}), Answer(503, b"{}", None, {})], 12.5, 1024, cpu)
    assert _round_trip(result.encode()) == result
    assert _round_trip(Ready(42, 100.0, cpu).encode()) == Ready(42, 100.0, cpu)
    assert _round_trip(LoadError("ValueError: no", "tb").encode()) == LoadError("ValueError: no", "tb")


def test_load_carries_the_whole_worker_spec() -> None:
    manifest = {"model": {"handler": "h.py"}}
    spec = WorkerSpec("m", "/d", manifest, 4, {"k": [1, "v"]}, 0, 2, 1, (0, 1), False, False, "json")
    assert _round_trip(Load(spec).encode()) == Load(spec)


def test_malformed_messages_are_protocol_errors() -> None:
    from servetune.server.messages import encode

    with pytest.raises(ProtocolError, match="unknown message type"):
        decode_message({"type": "nope"}, [])
    with pytest.raises(ProtocolError, match="answers but carries"):
        _round_trip(encode({"type": "result", "items": [[200, None, {}]], "handler_ms": 1.0}, []))
    with pytest.raises(ProtocolError, match="malformed predict"):
        _round_trip(encode({"type": "predict", "batch": [{"id": "a", "inputs": [["body", None]]}]}, []))
