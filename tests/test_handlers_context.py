"""Context and RequestProcessor: TorchServe's per-batch request/response bookkeeping."""

from __future__ import annotations

import pytest

from servetune.handlers.context import Context, RequestProcessor
from servetune.handlers.metrics import MetricsCache


def make_context() -> Context:
    return Context(
        "resnet",
        "/models/resnet",
        {"model": {"handler": "image_classifier"}},
        8,
        1,
        "0.1.0",
        limit_max_image_pixels=False,
        model_yaml_config={"handler": {"profile": True}},
    )


def test_system_properties_as_torchserve() -> None:
    ctx = make_context()
    assert ctx.system_properties == {
        "model_dir": "/models/resnet",
        "gpu_id": 1,
        "batch_size": 8,
        "server_name": "MMS",
        "server_version": "0.1.0",
        "limit_max_image_pixels": False,
    }
    assert ctx.model_name == "resnet" and ctx.manifest["model"]["handler"] == "image_classifier"
    assert isinstance(ctx.metrics, MetricsCache)
    assert ctx.model_yaml_config == {"handler": {"profile": True}}
    assert ctx.get_request_id() is None and ctx.request_processor is None


def test_request_headers_and_ids() -> None:
    ctx = make_context()
    ctx.request_ids = {0: "a", 1: "b"}
    ctx.request_processor = [RequestProcessor({"Explain": "True", "ts_request_sequence_id": "s"}), RequestProcessor({})]
    assert ctx.get_request_id(1) == "b"
    assert ctx.get_request_header(0, "Explain") == "True"
    assert ctx.get_request_header(0, "explain") == "True"  # HTTP header names ignore case
    assert ctx.get_request_header(1, "explain") is None
    assert ctx.get_all_request_header(0)["Explain"] == "True"
    assert ctx.get_sequence_id(0) == "s" and ctx.get_sequence_id(1) is None


def test_response_status_content_type_and_headers() -> None:
    ctx = make_context()
    ctx.request_processor = [RequestProcessor({}), RequestProcessor({})]
    assert ctx.get_response_status(0) == (200, None)
    ctx.set_response_status(404, "Nope", 1)
    ctx.set_response_content_type(0, "text/plain")
    ctx.set_response_header(0, "X-A", "1")
    assert ctx.get_response_status(1) == (404, "Nope") and ctx.get_response_status(0) == (200, None)
    assert ctx.get_response_content_type(0) == "text/plain" and ctx.get_response_content_type(1) is None
    assert ctx.get_response_headers(0) == {"content-type": "text/plain", "X-A": "1"}
    ctx.set_all_response_status(500, "Down")
    assert [ctx.get_response_status(i) for i in (0, 1)] == [(500, "Down"), (500, "Down")]


def test_no_batch_yet() -> None:
    ctx = make_context()
    ctx.set_response_status(500)  # ignored, as in TorchServe, before any batch
    with pytest.raises(RuntimeError, match="no request is being handled"):
        ctx.get_request_header(0, "x")
