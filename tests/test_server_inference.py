"""The inference API on a real server: ping, predictions, errors, timing headers, OpenAPI."""

from __future__ import annotations

from pathlib import Path

from http_client import burst, call
from models import sleep_archive


def test_ping_predict_and_timing_headers(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=5)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})

    ping = call("GET", f"{server.inference_url}/ping")
    assert ping.status == 200 and ping.json() == {"status": "Healthy"}

    reply = call("POST", f"{server.inference_url}/predictions/sleep", b"hello")
    assert reply.status == 200
    assert reply.json()["echo"] == "hello"
    assert reply.headers["content-type"] == "application/json"
    assert int(reply.headers["x-servetune-batch-size"]) == 1
    assert float(reply.headers["x-servetune-handler-ms"]) >= 5.0
    assert float(reply.headers["x-servetune-queue-ms"]) >= 0.0
    assert reply.headers["x-request-id"]

    versioned = call("PUT", f"{server.inference_url}/predictions/sleep/1.0", b"v")
    assert versioned.status == 200 and versioned.json()["echo"] == "v"


def test_errors_are_torchserve_json(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=0)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    base = server.inference_url

    missing = call("POST", f"{base}/predictions/nope", b"x")
    assert missing.status == 404
    assert missing.json() == {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"}

    bad_version = call("POST", f"{base}/predictions/sleep/9.9", b"x")
    assert bad_version.status == 404 and bad_version.json()["type"] == "ModelVersionNotFoundException"

    route = call("GET", f"{base}/no/such/route")
    assert route.status == 404 and route.json()["type"] == "ResourceNotFoundException"

    method = call("DELETE", f"{base}/ping")
    assert method.status == 405
    assert method.json()["message"] == "Requested method is not allowed, please refer to API document."


def test_multipart_field_reaches_handler_by_name(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=0)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    boundary = "XyZ"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="data"; filename="a.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\npayload-bytes\r\n"
        f"--{boundary}--\r\n"
    ).encode()
    reply = call(
        "POST",
        f"{server.inference_url}/predictions/sleep",
        body,
        {"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert reply.status == 200, reply.body
    assert reply.json()["echo"] == "payload-bytes"


def test_openapi_document_matches_routes(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server()
    spec = call("OPTIONS", f"{server.inference_url}/").json()
    assert spec["openapi"] == "3.0.1"
    assert {"/ping", "/predictions/{model_name}", "/predictions/{model_name}/{model_version}"} <= set(spec["paths"])
    mgmt = call("OPTIONS", f"{server.management_url}/").json()
    assert {"/models", "/models/{model_name}", "/models/{model_name}/{model_version}/set-default"} <= set(mgmt["paths"])


def test_concurrent_burst_runs_in_batches(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=50, model_config={"batchSize": 4, "maxBatchDelay": 200})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})

    replies = burst("POST", f"{server.inference_url}/predictions/sleep", [str(i).encode() for i in range(16)])
    assert all(r.status == 200 for r in replies)
    sizes = [int(r.headers["x-servetune-batch-size"]) for r in replies]
    assert max(sizes) > 1 and max(sizes) <= 4
    assert [r.json()["echo"] for r in replies] == [str(i) for i in range(16)]  # each got its own answer
    assert all(r.json()["batch_size"] == s for r, s in zip(replies, sizes, strict=True))

    metrics = call("GET", f"{server.metrics_url}/metrics").body.decode()
    count_line = next(line for line in metrics.splitlines() if line.startswith("servetune_batch_size_count"))
    sum_line = next(line for line in metrics.splitlines() if line.startswith("servetune_batch_size_sum"))
    batches, requests = float(count_line.split()[-1]), float(sum_line.split()[-1])
    assert requests == 16 and batches < 16
    assert "ts_inference_requests_total{hostname=" in metrics
    assert 'model_name="sleep",model_version="1.0"} 16.0' in metrics


def test_full_queue_answers_503_at_once(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=300, model_config={"jobQueueSize": 2})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    replies = burst("POST", f"{server.inference_url}/predictions/sleep", [b"x"] * 8)
    statuses = sorted(r.status for r in replies)
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1
    full = next(r for r in replies if r.status == 503)
    assert "full job queue" in full.json()["message"]
    assert full.headers["retry-after"] == "1"
