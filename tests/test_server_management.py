"""The management API on a real server: register, list, describe, scale, versions, unregister, auth."""

from __future__ import annotations

import threading
import urllib.parse
from pathlib import Path

from http_client import call, wait_for
from models import sleep_archive

OPEN = {"enable_model_api": "true"}


def test_register_describe_scale_unregister(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=1)
    server = start_server(model_store=store, properties=OPEN)
    mgmt = server.management_url

    reg = call("POST", f"{mgmt}/models?url=sleep.mar&initial_workers=1&batch_size=3&max_batch_delay=7")
    assert reg.status == 200, reg.body
    assert reg.json() == {"status": 'Model "sleep" Version: 1.0 registered with 1 initial workers'}

    desc = call("GET", f"{mgmt}/models/sleep").json()
    assert isinstance(desc, list) and len(desc) == 1
    info = desc[0]
    assert (info["modelName"], info["modelVersion"], info["batchSize"], info["maxBatchDelay"]) == ("sleep", "1.0", 3, 7)
    assert len(info["workers"]) == 1 and info["workers"][0]["status"] == "READY" and info["workers"][0]["pid"] > 0
    assert (info["workers"][0]["gpuUsage"], info["workers"][0]["gpuMemoryUsage"]) == ("N/A", 0)  # a CPU worker
    assert info["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}

    conflict = call("POST", f"{mgmt}/models?url=sleep.mar")
    assert conflict.status == 409 and conflict.json()["type"] == "ConflictStatusException"

    scaled = call("PUT", f"{mgmt}/models/sleep?min_worker=2&synchronous=true")
    assert scaled.status == 200 and scaled.json() == {"status": "Workers scaled to 2 for model: sleep"}
    pids = {w["pid"] for w in call("GET", f"{mgmt}/models/sleep").json()[0]["workers"]}
    assert len(pids) == 2

    bad = call("PUT", f"{mgmt}/models/sleep?min_worker=3&max_worker=1")
    assert bad.status == 400 and bad.json()["message"] == "max_worker cannot be less than min_worker."

    listing = call("GET", f"{mgmt}/models").json()
    assert listing == {"models": [{"modelName": "sleep", "modelUrl": "sleep.mar"}]}

    assert call("POST", f"{server.inference_url}/predictions/sleep", b"x").status == 200
    gone = call("DELETE", f"{mgmt}/models/sleep")
    assert gone.status == 200 and gone.json() == {"status": 'Model "sleep" unregistered'}
    assert call("POST", f"{server.inference_url}/predictions/sleep", b"x").status == 404
    assert server.worker_pids() == []


def test_register_errors(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store)
    outside = tmp_path / "outside"
    sleep_archive(outside, name="evil")
    server = start_server(model_store=store, properties=OPEN)
    mgmt = server.management_url

    assert call("POST", f"{mgmt}/models").json() == {
        "code": 400,
        "type": "BadRequestException",
        "message": "Parameter url is required.",
    }
    rel = call("POST", f"{mgmt}/models?url=../outside/evil.mar")
    assert rel.status == 404 and rel.json()["message"].startswith("Relative path is not allowed in url")
    absolute = call("POST", f"{mgmt}/models?url={urllib.parse.quote(str(outside / 'evil.mar'))}")
    assert absolute.status == 404 and "does not match any allowed URL" in absolute.json()["message"]
    remote = call("POST", f"{mgmt}/models?url=http://127.0.0.1:1/x.mar")
    assert remote.status == 404 and "does not match any allowed URL" in remote.json()["message"]
    missing = call("POST", f"{mgmt}/models?url=nothere.mar")
    assert missing.status == 404 and missing.json()["type"] == "ModelNotFoundException"
    unknown = call("GET", f"{mgmt}/models/nothere")
    assert unknown.status == 404 and unknown.json()["message"] == "Model not found: nothere"


def test_model_api_is_closed_by_default(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    closed = call("POST", f"{server.management_url}/models?url=sleep.mar")
    assert closed.status == 405
    assert closed.json() == {
        "code": 405,
        "type": "MethodNotAllowedException",
        "message": "Requested method is not allowed, please refer to API document.",
    }
    assert call("DELETE", f"{server.management_url}/models/sleep").status == 405
    # Scaling and describing stay available, as in TorchServe.
    assert call("PUT", f"{server.management_url}/models/sleep?min_worker=1&synchronous=true").status == 200


def test_versions_and_set_default(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, name="m1", version="1.0")
    sleep_archive(store, name="m2", version="2.0")
    server = start_server(model_store=store, properties=OPEN)
    mgmt, inf = server.management_url, server.inference_url
    assert call("POST", f"{mgmt}/models?url=m1.mar&model_name=m&initial_workers=1").status == 200
    assert call("POST", f"{mgmt}/models?url=m2.mar&model_name=m&initial_workers=1").status == 200
    versions = [d["modelVersion"] for d in call("GET", f"{mgmt}/models/m/all").json()]
    assert versions == ["1.0", "2.0"]
    assert call("PUT", f"{mgmt}/models/m/2.0/set-default").json() == {
        "status": 'Default version successfully updated for model "m" to "2.0"'
    }
    assert call("GET", f"{mgmt}/models/m").json()[0]["modelVersion"] == "2.0"
    refused = call("DELETE", f"{mgmt}/models/m/2.0")
    assert refused.status == 403
    assert call("DELETE", f"{mgmt}/models/m/1.0").status == 200
    assert call("POST", f"{inf}/predictions/m", b"x").status == 200


def test_paging(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    for name in ("a", "b", "c"):
        sleep_archive(store, name=name)
    server = start_server(model_store=store, properties=OPEN)
    for name in ("a", "b", "c"):
        assert call("POST", f"{server.management_url}/models?url={name}.mar&initial_workers=0").status == 200
    first = call("GET", f"{server.management_url}/models?limit=2").json()
    assert [m["modelName"] for m in first["models"]] == ["a", "b"] and first["nextPageToken"] == "2"
    second = call("GET", f"{server.management_url}/models?limit=2&next_page_token=2").json()
    assert [m["modelName"] for m in second["models"]] == ["c"] and "nextPageToken" not in second


def test_scaling_up_and_down_under_load_loses_nothing(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=10, model_config={"batchSize": 2, "maxBatchDelay": 5})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    url = f"{server.inference_url}/predictions/sleep"
    stop = threading.Event()
    results: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def client(idx: int) -> None:
        n = 0
        while not stop.is_set():
            body = f"{idx}-{n}"
            reply = call("POST", url, body.encode())
            echo = reply.json().get("echo", "") if reply.status == 200 else ""
            with lock:
                results.append((reply.status, body, echo))
            n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        # Workers forked from the model's parent start in milliseconds: the sequence runs again until the clients
        # have sent enough requests across it.
        for _ in range(20):
            for workers in (3, 1, 2, 1):
                scaled = call("PUT", f"{server.management_url}/models/sleep?min_worker={workers}&synchronous=true")
                assert scaled.status == 200, scaled.body
                live = call("GET", f"{server.management_url}/models/sleep").json()[0]["workers"]
                assert len(live) == workers
            with lock:
                if len(results) > 20:
                    break
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(results) > 20
    assert all(status == 200 for status, _, _ in results), {s for s, _, _ in results}
    assert all(body == echo for _, body, echo in results)


def test_a_request_queued_when_the_last_worker_retires_is_answered_503_at_once(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    """A request waits in the queue for its batch to fill (batch 4, 10 s delay) when the model is scaled to 0: its
    worker, idle, retires at once, and the request gets 503 (no worker) then, not after a wait for a worker that
    never comes."""
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=0, model_config={"batchSize": 4, "maxBatchDelay": 10000})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    replies = []
    waiting = threading.Thread(
        target=lambda: replies.append(call("POST", f"{server.inference_url}/predictions/sleep", b"x", timeout=60))
    )
    waiting.start()
    wait_for(lambda: pending(server) == 1, 10, "the request to be queued")
    scaled = call("PUT", f"{server.management_url}/models/sleep?min_worker=0&synchronous=true")
    assert scaled.status == 200, scaled.body
    waiting.join(5)
    assert not waiting.is_alive(), "the queued request was not answered when the last worker retired"
    [reply] = replies
    assert (reply.status, reply.json()["type"]) == (503, "ServiceUnavailableException"), reply.body
    assert pending(server) == 0


def pending(server) -> int:  # type: ignore[no-untyped-def]
    described = call("GET", f"{server.management_url}/models/sleep").json()[0]
    return int(described["jobQueueStatus"]["pendingRequests"])


def test_management_requires_token_when_auth_is_on(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store)
    server = start_server(
        model_store=store, models={"sleep": "sleep.mar"}, properties={"disable_token_authorization": "false"}
    )
    key_file = server.workdir / "key_file.json"
    assert key_file.stat().st_mode & 0o777 == 0o600
    refused = call("GET", f"{server.management_url}/models")
    assert refused.status == 400 and refused.json()["type"] == "InvalidKeyException"
    wrong = call("GET", f"{server.management_url}/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status == 400
    ok = call("GET", f"{server.management_url}/models", headers=server.auth())
    assert ok.status == 200
    # Inference and metrics stay open by default; OPTIONS / is never token-checked.
    assert call("POST", f"{server.inference_url}/predictions/sleep", b"x").status == 200
    assert call("GET", f"{server.metrics_url}/metrics").status == 200
    assert call("OPTIONS", f"{server.management_url}/").status == 200


def test_customized_describe_asks_the_handler(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=3, model_config={"batchSize": 4, "maxBatchDelay": 100})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    plain = call("GET", f"{server.management_url}/models/sleep").json()[0]
    assert "customizedMetadata" not in plain
    custom = call("GET", f"{server.management_url}/models/sleep?customized=true").json()[0]
    # The describe job runs in a batch of its own, whatever the model's batch size.
    assert custom["customizedMetadata"] == {"handler": "sleep", "config": {"batch_ms": 3, "item_ms": 0.0}, "batch": 1}


def test_batching_changes_in_place_without_restarting_workers(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    """servetune's extension: ``PUT /models/{name}?batch_size=&max_batch_delay=`` (TorchServe re-registers)."""
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=150, model_config={"batchSize": 1, "maxBatchDelay": 0})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    mgmt, url = server.management_url, f"{server.inference_url}/predictions/sleep"

    def burst(n: int) -> list[dict[str, object]]:
        replies: list[dict[str, object]] = []
        threads = [threading.Thread(target=lambda i=i: replies.append(call("POST", url, f"{i}".encode()).json()))
                   for i in range(n)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return replies

    before = call("GET", f"{mgmt}/models/sleep").json()[0]
    pids = {w["pid"] for w in before["workers"]}
    assert {r["batch_size"] for r in burst(4)} == {1}

    changed = call("PUT", f"{mgmt}/models/sleep?batch_size=4&max_batch_delay=400")
    assert changed.status == 200, changed.body
    assert changed.json() == {"status": "Batching set to batch_size=4, max_batch_delay=400 for model: sleep"}
    after = call("GET", f"{mgmt}/models/sleep").json()[0]
    assert (after["batchSize"], after["maxBatchDelay"]) == (4, 400)
    assert {w["pid"] for w in after["workers"]} == pids  # same worker processes
    replies = burst(4)
    assert [r["batch_size"] for r in replies] == [4, 4, 4, 4]
    assert {r["configured"] for r in replies} == {4}  # the handler's context follows
    assert {r["pid"] for r in replies} == pids

    # Only the delay; then batching and workers in one call.
    assert call("PUT", f"{mgmt}/models/sleep?max_batch_delay=5").status == 200
    assert call("GET", f"{mgmt}/models/sleep").json()[0]["batchSize"] == 4
    both = call("PUT", f"{mgmt}/models/sleep?batch_size=2&min_worker=2&synchronous=true")
    assert both.status == 200 and both.json()["status"].endswith("; Workers scaled to 2 for model: sleep")
    described = call("GET", f"{mgmt}/models/sleep").json()[0]
    assert (described["batchSize"], described["maxBatchDelay"], len(described["workers"])) == (2, 5, 2)

    # Bad values are refused and change nothing, even alongside a valid scale request.
    for query in ("batch_size=0", "batch_size=two", "max_batch_delay=-1", "batch_size=4&min_worker=3&max_worker=1"):
        refused = call("PUT", f"{mgmt}/models/sleep?{query}")
        assert refused.status == 400, (query, refused.body)
        assert refused.json()["type"] == "BadRequestException" or refused.json()["code"] == 400
    described = call("GET", f"{mgmt}/models/sleep").json()[0]
    assert (described["batchSize"], described["maxBatchDelay"], len(described["workers"])) == (2, 5, 2)


def test_workers_share_the_cores_anew_after_scaling(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    # Threads per worker are automatic here (no threads_per_worker, no numThreads): physical cores // workers. A worker
    # started alone keeps its threads when a second one joins unless the frontend tells it (it does, per batch).
    from servetune.hardware import physical_cores

    store = tmp_path / "store"
    sleep_archive(store, batch_ms=50, model_config={"sleep": {"import_torch": True}})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    url, cores = f"{server.inference_url}/predictions/sleep", physical_cores()
    assert call("POST", url, b"x").json()["threads"] == cores
    first_pid = call("GET", f"{server.management_url}/models/sleep").json()[0]["workers"][0]["pid"]
    assert call("PUT", f"{server.management_url}/models/sleep?min_worker=2&synchronous=true").status == 200
    replies = [call("POST", url, f"{i}".encode()).json() for i in range(6)]
    assert first_pid in {r["pid"] for r in replies}
    assert {r["threads"] for r in replies} == {max(1, cores // 2)}, [(r["pid"], r["threads"]) for r in replies]
