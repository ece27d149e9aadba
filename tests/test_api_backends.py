"""One API, two backends: the same inference, management and metrics behaviour, checked on the native server and on
Ray Serve (a private local Ray instance; skipped where Ray is not installed). The smoke suite of each backend: every
protocol (TorchServe's REST and gRPC, KServe v1, OIP v2 over REST and gRPC, gRPC health) reaches a model on it; each
protocol's details are tested in process (test_api_kserve.py, test_grpc_api.py).

Each backend serves the same archives: ``sleep`` (batch 4, delay 150 ms, 30 ms a batch; versions 1.0 and 2.0; OIP
metadata from its handler), ``slow`` (responseTimeout 1 s), ``narrow`` (a queue of one request, 400 ms a batch).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from backends import BACKENDS, HAS_RAY, backend_server
from http_client import Reply, burst, call, wait_for
from models import sleep_archive
from ray_cluster import cluster_fixture  # noqa: F401  (the fixture ``cluster``)
from servetune.embedded import EmbeddedServer
from servetune.protos import HEALTH, OIP, TORCHSERVE_INFERENCE, methods


class Api:
    """A running server of one backend, with its management key."""

    def __init__(self, server: EmbeddedServer, backend: str) -> None:
        self.server = server
        self.backend = backend
        self.inference = server.inference_url
        self.management = server.management_url
        self.metrics = server.metrics_url
        self.auth = server.auth_headers("management")

    def predict(self, body: bytes = b"hello", path: str = "sleep", ctype: str = "text/plain") -> Reply:
        return call("POST", f"{self.inference}/predictions/{path}", body, {"Content-Type": ctype})

    def manage(self, method: str, path: str) -> Reply:
        return call(method, f"{self.management}{path}", headers=self.auth, timeout=180)

    def counter(self, name: str, model: str) -> float:
        text = call("GET", f"{self.metrics}/metrics").body.decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and f'model_name="{model}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


def build_store(store: Path) -> None:
    sleep_archive(store, batch_ms=30, model_config={"batchSize": 4, "maxBatchDelay": 150})
    (store / "sleep.mar").rename(store / "sleep1.mar")
    sleep_archive(store, batch_ms=1, version="2.0")
    (store / "sleep.mar").rename(store / "sleep2.mar")
    sleep_archive(store, name="slow", batch_ms=1, model_config={"responseTimeout": 1})
    sleep_archive(store, name="narrow", batch_ms=400, model_config={"jobQueueSize": 1})


@pytest.fixture(scope="module", params=BACKENDS)
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    backend = request.param
    store = tmp_path_factory.mktemp("store")
    build_store(store)
    properties = {"default_workers_per_model": "1", "enable_model_api": "true", "max_request_size": "100000"}
    models = {"sleep": "sleep1.mar", "slow": "slow.mar", "narrow": "narrow.mar"}
    # Ray: the run's cluster (ray_cluster.py; 4 CPUs: a replica each for the three models and sleep's version 2.0)
    address = request.getfixturevalue("cluster").address if backend == "ray" and HAS_RAY else "local"
    server = backend_server(backend, tmp_path_factory, store, models, properties, address)
    try:
        yield Api(server.start(), backend)
    finally:
        server.stop()


# ---- inference -------------------------------------------------------------------------------


def test_predictions_answer_with_the_handler_and_the_timing_headers(api: Api) -> None:
    reply = api.predict(b"hello")
    assert reply.status == 200, reply.body
    assert reply.json()["echo"] == "hello"
    assert float(reply.headers["x-servetune-handler-ms"]) >= 30.0
    assert reply.headers["x-servetune-batch-size"] == "1"
    assert float(reply.headers["x-servetune-queue-ms"]) >= 0.0
    assert call("GET", f"{api.inference}/ping").json() == {"status": "Healthy"}


def test_requests_are_batched_up_to_the_batch_size(api: Api) -> None:
    replies = burst("POST", f"{api.inference}/predictions/sleep", [f"b{i}".encode() for i in range(8)])
    assert all(r.status == 200 for r in replies), [r.body for r in replies]
    sizes = [int(r.headers["x-servetune-batch-size"]) for r in replies]
    assert 1 < max(sizes) <= 4, sizes


def test_inference_errors_are_torchserve_json(api: Api) -> None:
    unknown = api.predict(b"x", "nope")
    assert (unknown.status, unknown.json()) == (
        404,
        {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"},
    )
    version = api.predict(b"x", "sleep/9.9")
    assert (version.status, version.json()["type"]) == (404, "ModelVersionNotFoundException")
    assert version.json()["message"] == "Model version: 9.9 does not exist for model: sleep"
    boom = api.predict(b"boom")
    assert (boom.status, boom.json()) == (
        503,
        {"code": 503, "type": "InternalServerException", "message": "Prediction failed"},
    )
    assert call("GET", f"{api.inference}/predictions/sleep").status == 405
    nowhere = call("GET", f"{api.inference}/nowhere")
    assert (nowhere.status, nowhere.json()["type"]) == (404, "ResourceNotFoundException")
    big = api.predict(b"x" * 200_000)
    assert (big.status, big.json()["type"]) == (413, "RequestEntityTooLargeException")


def test_a_handler_that_overruns_its_timeout_gets_a_504(api: Api) -> None:
    reply = api.predict(b"sleep:3", "slow", "application/octet-stream")
    assert (reply.status, reply.json()["type"]) == (504, "RequestTimeoutException"), reply.body
    wait_for(lambda: api.predict(b"again", "slow").status == 200, 120, "the worker to be replaced")


def test_a_full_queue_gets_a_503_with_retry_after(api: Api) -> None:
    replies = burst("POST", f"{api.inference}/predictions/narrow", [b"q"] * 8)
    refused = [r for r in replies if r.status == 503]
    assert refused and any(r.status == 200 for r in replies), [r.status for r in replies]
    for reply in refused:
        assert reply.json()["type"] == "ServiceUnavailableException", reply.body
        assert reply.headers["retry-after"] == "1"


def test_a_worker_that_dies_mid_request_gets_a_503_and_is_replaced(api: Api) -> None:
    reply = api.predict(b"exit")
    assert (reply.status, reply.json()["type"]) == (503, "ServiceUnavailableException"), reply.body
    assert reply.json()["message"].startswith("Worker died while running this request")
    wait_for(lambda: api.predict(b"back").status == 200, 120, "a new worker")


def test_the_api_description_lists_the_routes(api: Api) -> None:
    spec = call("OPTIONS", f"{api.inference}/").json()
    assert spec["openapi"] == "3.0.1" and "/predictions/{model_name}" in spec["paths"]
    assert "/models/{model_name}" in call("OPTIONS", f"{api.management}/").json()["paths"]


# ---- management ------------------------------------------------------------------------------


def test_describe_has_torchserve_fields_and_customized_metadata(api: Api) -> None:
    [described] = api.manage("GET", "/models/sleep?customized=true").json()
    assert (described["modelName"], described["modelVersion"], described["batchSize"]) == ("sleep", "1.0", 4)
    assert (described["maxBatchDelay"], described["minWorkers"], described["isDefault"]) == (150, 1, True)
    assert described["workers"] and all(w["status"] == "READY" and w["pid"] > 0 for w in described["workers"])
    assert described["customizedMetadata"]["handler"] == "sleep"
    listing = api.manage("GET", "/models").json()
    assert [m["modelName"] for m in listing["models"]] == ["narrow", "sleep", "slow"]
    assert api.manage("GET", "/models?limit=1&next_page_token=1").json() == {
        "nextPageToken": "2",
        "models": [{"modelName": "sleep", "modelUrl": "sleep1.mar"}],
    }


def test_register_set_default_scale_to_zero_and_unregister(api: Api) -> None:
    """And none of it restarts version 1.0's workers (on Ray, a version's replicas are replaced only when its own
    application's args change: another version's registration, scaling, default or removal must not do that)."""
    workers = {w["pid"] for w in api.manage("GET", "/models/sleep/1.0").json()[0]["workers"]}
    registered = api.manage("POST", "/models?url=sleep2.mar&initial_workers=1&synchronous=true")
    assert registered.json() == {"status": 'Model "sleep" Version: 2.0 registered with 1 initial workers'}
    assert api.manage("POST", "/models?url=sleep2.mar").status == 409
    assert api.predict(b"v2", "sleep/2.0").status == 200
    assert api.manage("PUT", "/models/sleep/2.0/set-default").json() == {
        "status": 'Default version successfully updated for model "sleep" to "2.0"'
    }
    assert api.manage("GET", "/models/sleep").json()[0]["modelVersion"] == "2.0"
    assert api.predict(b"default").status == 200
    assert api.manage("DELETE", "/models/sleep/2.0").status == 403  # the default, while 1.0 remains
    assert api.manage("PUT", "/models/sleep/1.0/set-default").status == 200

    scaled = api.manage("PUT", "/models/sleep/2.0?min_worker=0&synchronous=true")
    assert scaled.json() == {"status": "Workers scaled to 0 for model: sleep, version: 2.0"}
    idle = api.predict(b"x", "sleep/2.0")  # a synchronous reply means the change is in effect
    assert idle.status == 503, idle.body
    assert idle.json()["message"].startswith('Model "sleep" has no worker to serve inference request.')
    assert idle.headers["retry-after"] == "1"
    assert api.manage("DELETE", "/models/sleep/2.0").json() == {"status": 'Model "sleep" unregistered'}
    assert api.manage("GET", "/models/sleep/2.0").status == 404
    assert api.predict(b"still").status == 200
    assert {w["pid"] for w in api.manage("GET", "/models/sleep/1.0").json()[0]["workers"]} == workers


def test_another_version_answers_while_the_default_has_no_workers(api: Api) -> None:
    """Versions are independent, as TorchServe's: the default scaled to 0 workers answers 503, version 2.0 still
    answers (on Ray, through the frontend, which holds the model's route meanwhile)."""
    assert api.manage("POST", "/models?url=sleep2.mar&initial_workers=1&synchronous=true").status == 200
    try:
        assert api.manage("PUT", "/models/sleep/1.0?min_worker=0&synchronous=true").status == 200
        idle = api.predict(b"x")
        assert idle.status == 503, idle.body
        other = api.predict(b"x", "sleep/2.0")
        assert (other.status, other.json()["echo"]) == (200, "x"), other.body
    finally:
        assert api.manage("PUT", "/models/sleep/1.0?min_worker=1&synchronous=true").status == 200
        assert api.manage("DELETE", "/models/sleep/2.0").status == 200
    assert api.predict(b"back").status == 200


def test_requests_sent_while_a_version_goes_to_zero_workers_are_all_answered(api: Api) -> None:
    """On Ray the ingress replica that routed a request may still hold the config before while the version's
    deployment is deleted: Ray's router would wait for a replica that never comes (a request hung for a minute in a
    CI run). Each request is answered, 200 or 503, within seconds. Five changes, a request every 50 ms: the code
before this answer hung in one of them (a tight loop missed the window in three)."""
    assert api.manage("POST", "/models?url=sleep2.mar&initial_workers=1&synchronous=true").status == 200
    for _ in range(5):
        scaled = api.manage("PUT", "/models/sleep/2.0?min_worker=0")  # asynchronous: requests race the change
        assert scaled.status == 202, scaled.body
        statuses: list[int] = []
        while not statuses or statuses[-1] != 503:
            started = time.monotonic()
            reply = call("POST", f"{api.inference}/predictions/sleep/2.0", b"x", timeout=30)
            assert reply.status in (200, 503), reply.body
            assert time.monotonic() - started < 10, f"answered {reply.status} after {time.monotonic() - started:.1f} s"
            statuses.append(reply.status)
            time.sleep(0.05)
            assert len(statuses) < 2000, "the version kept answering after it was scaled to 0 workers"
        assert api.manage("PUT", "/models/sleep/2.0?min_worker=1&synchronous=true").status == 200
        back = api.predict(b"back", "sleep/2.0")  # on Ray: through a new handle to the new deployment
        assert back.status == 200, back.body
    assert api.manage("DELETE", "/models/sleep/2.0").status == 200


def test_batch_size_and_threads_change_in_place(api: Api) -> None:
    pids = {w["pid"] for w in api.manage("GET", "/models/sleep").json()[0]["workers"]}
    changed = api.manage("PUT", "/models/sleep?batch_size=2&max_batch_delay=50&num_threads=1")
    assert changed.status == 200, changed.body
    assert changed.json()["status"].startswith("Batching set to batch_size=2, max_batch_delay=50 for model: sleep")
    [described] = api.manage("GET", "/models/sleep").json()
    assert (described["batchSize"], described["maxBatchDelay"], described["numThreads"]) == (2, 50, 1)
    assert {w["pid"] for w in described["workers"]} == pids, "an in-place change must not restart workers"
    replies = burst("POST", f"{api.inference}/predictions/sleep", [b"r"] * 6)
    assert max(int(r.headers["x-servetune-batch-size"]) for r in replies) <= 2
    assert {r.json()["configured"] for r in replies} == {2}  # the handler's context follows
    bad = api.manage("PUT", "/models/sleep?batch_size=0")
    assert (bad.status, bad.json()["message"]) == (400, "batch_size must be between 1 and 1000000, got 0")
    assert api.manage("PUT", "/models/sleep?batch_size=4&max_batch_delay=150").status == 200


def test_management_needs_its_token_and_tokens_regenerate(api: Api) -> None:
    refused = call("GET", f"{api.management}/models")
    assert (refused.status, refused.json()["type"]) == (400, "InvalidKeyException")
    api_key = {
        "Authorization": f"Bearer {json.loads(Path(api.server.properties['key_file']).read_text())['API']['key']}"
    }
    fresh = call("GET", f"{api.management}/token?type=management", headers=api_key).json()["management"]["key"]
    assert call("GET", f"{api.management}/models", headers={"Authorization": f"Bearer {fresh}"}).status == 200
    assert call("GET", f"{api.management}/models", headers=api.auth).status == 400  # the old key is gone
    api.auth = {"Authorization": f"Bearer {fresh}"}


# ---- metrics ---------------------------------------------------------------------------------


def test_metrics_count_every_request(api: Api) -> None:
    before = api.counter("ts_inference_requests_total", "sleep")
    for _ in range(5):
        assert api.predict(b"m").status == 200
    wait_for(lambda: api.counter("ts_inference_requests_total", "sleep") >= before + 5, 15, "the counter")
    assert api.counter("servetune_request_latency_seconds_count", "sleep") >= 5
    assert api.counter("servetune_batch_size_count", "sleep") >= 5


# ---- every protocol reaches the model on this backend --------------------------------------------------------------

JSON = {"Content-Type": "application/json"}
SLEEP_METADATA = {"platform": "python_sleep", "inputs": [{"name": "body", "datatype": "BYTES", "shape": [-1]}]}


def test_kserve_v1_and_oip_v2_rest_reach_the_model(api: Api) -> None:
    before = api.counter("ts_inference_requests_total", "sleep")
    v1 = call("POST", f"{api.inference}/v1/models/sleep:predict", b'{"instances": [{"data": "v1"}]}', JSON)
    assert v1.status == 200 and v1.json()["predictions"][0]["echo"] == "v1", v1.body
    assert call("GET", f"{api.inference}/v1/models/sleep").json() == {"name": "sleep", "ready": True}
    body = {"id": "s1", "inputs": [{"name": "body", "shape": [1], "datatype": "BYTES", "data": ["v2"]}]}
    v2 = call("POST", f"{api.inference}/v2/models/sleep/infer", json.dumps(body).encode(), JSON)
    assert v2.status == 200, v2.body
    assert (v2.json()["id"], v2.json()["model_version"]) == ("s1", "1.0")
    assert json.loads(v2.json()["outputs"][0]["data"][0])["echo"] == "v2"
    assert int(v2.headers["x-servetune-batch-size"]) >= 1
    metadata = call("GET", f"{api.inference}/v2/models/sleep").json()  # the handler's, as its worker reported it
    assert metadata == {"name": "sleep", "versions": ["1.0"], "outputs": [], **SLEEP_METADATA}
    assert call("GET", f"{api.inference}/v2/models/sleep/ready").json() == {"name": "sleep", "ready": True}
    assert call("GET", f"{api.inference}/v2/health/ready").json() == {"ready": True}
    missing = call("POST", f"{api.inference}/v2/models/nope/infer", json.dumps(body).encode(), JSON)
    assert missing.status == 404 and list(missing.json()) == ["error"]
    wait_for(lambda: api.counter("ts_inference_requests_total", "sleep") >= before + 2, 15, "v1 and v2 counted")


def grpc_call(target: str, service: str, rpc: str, /, **fields: Any) -> Any:
    method = methods(service)[rpc]
    with grpc.insecure_channel(target) as channel:
        call = (channel.unary_stream if method.server_streaming else channel.unary_unary)(
            method.path, request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        answer = call(method.request(**fields), timeout=60)
        return list(answer) if method.server_streaming else answer


def test_grpc_services_reach_the_model(api: Api) -> None:
    target = api.server.grpc_inference_target
    predicted = grpc_call(target, TORCHSERVE_INFERENCE, "Predictions", model_name="sleep", input={"data": b"g"})
    assert json.loads(predicted.prediction)["echo"] == "g"
    streamed = grpc_call(target, TORCHSERVE_INFERENCE, "StreamPredictions", model_name="sleep",
                         input={"data": b"stream:2"})
    assert [m.prediction for m in streamed[:2]] == [b"part 0", b"part 1"]
    assert json.loads(streamed[2].prediction)["echo"] == "stream:2" and len(streamed) == 3
    tensor = {"name": "body", "datatype": "BYTES", "shape": [1], "contents": {"bytes_contents": [b"oip"]}}
    answer = grpc_call(target, OIP, "ModelInfer", model_name="sleep", id="g1", inputs=[tensor])
    assert (answer.id, answer.model_version) == ("g1", "1.0")
    assert json.loads(answer.outputs[0].contents.bytes_contents[0])["echo"] == "oip"
    metadata = grpc_call(target, OIP, "ModelMetadata", name="sleep")
    assert (metadata.platform, [i.name for i in metadata.inputs]) == ("python_sleep", ["body"])
    assert grpc_call(target, OIP, "ModelReady", name="sleep").ready
    assert grpc_call(target, HEALTH, "Check", service="sleep").status == 1  # SERVING
    with pytest.raises(grpc.RpcError) as missing:
        grpc_call(target, TORCHSERVE_INFERENCE, "Predictions", model_name="nope", input={"data": b"g"})
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
