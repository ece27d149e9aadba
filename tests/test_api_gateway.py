"""The gateway (servetune.api.gateway) decides once for every protocol and transport: the same token rule, the same
readiness rules, the same counting and the same timing fields on REST and gRPC. In process (tests/inprocess.py): the
real HTTP and gRPC stacks over a fake backend; the real backends run these paths in tests/test_api_backends.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from http_client import Reply, call
from inprocess import InProcessServer
from models import sleep_archive
from servetune.protos import HEALTH, OIP, TORCHSERVE_INFERENCE, TORCHSERVE_MANAGEMENT, methods
from servetune.timing import BATCH_SIZE, HANDLER_MS, QUEUE_MS

JSON = {"Content-Type": "application/json"}
V2 = json.dumps({"inputs": [{"name": "body", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}).encode()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store")
    sleep_archive(path, "m", batch_ms=0)
    return path


def serve(store: Path, workdir: Path, **properties: str) -> InProcessServer:
    return InProcessServer(store, {"m": "m.mar"}, {"enable_model_api": "true", **properties}, workdir=workdir).start()


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    running = serve(store, tmp_path_factory.mktemp("server"), disable_token_authorization="true")
    yield running
    running.stop()


def rpc(server: InProcessServer, service: str, rpc_name: str, key: str | None = None, /, **fields: Any) -> Any:
    """One gRPC call: its answer (a stream's messages), or the RpcError it raised."""
    method = methods(service)[rpc_name]
    target = server.grpc_management_target if service == TORCHSERVE_MANAGEMENT else server.grpc_inference_target
    with grpc.insecure_channel(target) as channel:
        stub = (channel.unary_stream if method.server_streaming else channel.unary_unary)(
            method.path, request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        metadata = (("authorization", f"Bearer {key}"),) if key else None
        try:
            answer = stub(method.request(**fields), timeout=30, metadata=metadata)
            return list(answer) if method.server_streaming else answer
        except grpc.RpcError as exc:
            return exc


def rest(server: InProcessServer, method: str, path: str, body: bytes | None = None, key: str | None = None) -> Reply:
    port = server.management_url if path.startswith("/models") else server.inference_url
    kind = JSON if path.startswith("/v") else {"Content-Type": "text/plain"}
    headers = {**kind, **({"Authorization": f"Bearer {key}"} if key else {})}
    return call(method, f"{port}{path}", body, headers)


def refused(answer: Any) -> bool:
    """Refused for its token, in its protocol's shape."""
    if isinstance(answer, grpc.RpcError):
        return answer.code() == grpc.StatusCode.UNAUTHENTICATED and "Token Authorization" in str(answer.details())
    if isinstance(answer, Reply):
        payload = answer.json()
        message = payload.get("error") or payload.get("message")  # KServe's shape, TorchServe's
        return answer.status == 400 and "Token Authorization failed" in message
    return False


def calls(server: InProcessServer) -> dict[str, dict[str, Any]]:
    """Every kind of call, on both transports: access -> name -> a function of the key sent."""
    v2_infer = {"model_name": "m", "inputs": [{"name": "body", "datatype": "BYTES", "shape": [1],
                                               "contents": {"bytes_contents": [b"x"]}}]}
    return {
        "probe": {
            "GET /ping": lambda key: rest(server, "GET", "/ping", key=key),
            "GET /v1/models/m": lambda key: rest(server, "GET", "/v1/models/m", key=key),
            "GET /v2/health/ready": lambda key: rest(server, "GET", "/v2/health/ready", key=key),
            "GET /v2/models/m": lambda key: rest(server, "GET", "/v2/models/m", key=key),
            "Ping": lambda key: rpc(server, TORCHSERVE_INFERENCE, "Ping", key),
            "ServerReady": lambda key: rpc(server, OIP, "ServerReady", key),
            "ServerMetadata": lambda key: rpc(server, OIP, "ServerMetadata", key),
            "ModelMetadata": lambda key: rpc(server, OIP, "ModelMetadata", key, name="m"),
            "Health.Check": lambda key: rpc(server, HEALTH, "Check", key, service="m"),
        },
        "inference": {
            "POST /predictions/m": lambda key: rest(server, "POST", "/predictions/m", b"x", key),
            "POST /v1/models/m:predict": lambda key: rest(server, "POST", "/v1/models/m:predict",
                                                         b'{"instances": [{"data": "x"}]}', key),
            "POST /v2/models/m/infer": lambda key: rest(server, "POST", "/v2/models/m/infer", V2, key),
            "Predictions": lambda key: rpc(server, TORCHSERVE_INFERENCE, "Predictions", key, model_name="m",
                                           input={"data": b"x"}),
            "StreamPredictions": lambda key: rpc(server, TORCHSERVE_INFERENCE, "StreamPredictions", key,
                                                 model_name="m", input={"data": b"x"}),
            "ModelInfer": lambda key: rpc(server, OIP, "ModelInfer", key, **v2_infer),
        },
        "management": {
            "GET /models": lambda key: rest(server, "GET", "/models", key=key),
            "ListModels": lambda key: rpc(server, TORCHSERVE_MANAGEMENT, "ListModels", key),
        },
    }


def answered(answer: Any) -> bool:
    return not isinstance(answer, grpc.RpcError) and (not isinstance(answer, Reply) or answer.status == 200)


@pytest.mark.parametrize("open_ping", [True, False], ids=["open_ping", "closed_ping"])
def test_one_token_rule_on_every_protocol_and_transport(store: Path, tmp_path: Path, open_ping: bool) -> None:
    server = serve(store, tmp_path, disable_token_authorization="false", inference_token_authorization="true",
                   open_ping=str(open_ping).lower())
    try:
        tokens = server.server.tokens
        assert tokens is not None
        inference, management = tokens.keys["inference"].value, tokens.keys["management"].value
        for access, table in calls(server).items():
            key = management if access == "management" else inference
            for name, make in table.items():
                if access == "probe" and open_ping:
                    assert answered(make(None)), name  # probes follow /ping: open
                else:
                    assert refused(make(None)) and refused(make("wrong")), name
                    wrong_kind = inference if access == "management" else management
                    assert refused(make(wrong_kind)), name
                assert answered(make(key)), (name, make(key))
    finally:
        server.stop()


def counters(server: InProcessServer) -> dict[str, float]:
    text = call("GET", f"{server.metrics_url}/metrics").body.decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("Requests2XX", "Requests4XX", "Requests5XX", "ts_inference_requests_total"):
            if line.startswith(name) and ('model_name="m"' in line or name.startswith("Requests")):
                found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def test_every_prediction_is_counted_once_whatever_its_transport(server: InProcessServer) -> None:
    before = counters(server)
    table = calls(server)["inference"]
    for name in ("POST /predictions/m", "POST /v1/models/m:predict", "POST /v2/models/m/infer", "Predictions",
                 "ModelInfer"):
        assert answered(table[name](None)), name
    assert rest(server, "POST", "/predictions/nope", b"x").status == 404
    assert rest(server, "POST", "/v2/models/nope/infer", V2).status == 404
    assert rpc(server, TORCHSERVE_INFERENCE, "Predictions", model_name="nope").code() == grpc.StatusCode.NOT_FOUND
    assert rpc(server, OIP, "ModelInfer", model_name="").code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rest(server, "GET", "/v2/models/nope").status == 404  # a probe: not a prediction, not counted
    after = counters(server)
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    assert delta == {"Requests2XX": 5, "Requests4XX": 4, "Requests5XX": 0, "ts_inference_requests_total": 5}


def test_the_direct_prediction_routes_answer_as_the_router_did(server: InProcessServer) -> None:
    # POST /predictions, v1 :predict and v2 infer skip Starlette's router (rest.with_direct_routes): the same answers,
    # headers and error shapes; what they do not take (another method, another path) still reaches the router.
    for path in ("/predictions/m", "/predictions/m/"):
        reply = call("POST", f"{server.inference_url}{path}", b"x", {"x-request-id": "rid-1"})
        assert reply.status == 200, path
        assert reply.headers["x-request-id"] == "rid-1" and reply.headers["cache-control"].startswith("no-cache")
        assert int(reply.headers["content-length"]) == len(reply.body) and reply.headers[BATCH_SIZE] == "1"
    assert rest(server, "PUT", "/predictions/m", b"x").status == 200
    assert rest(server, "POST", "/predictions/m/9.9", b"x").json()["code"] == 404  # TorchServe's error shape
    assert set(rest(server, "POST", "/v1/models/nope:predict", b"{}").json()) == {"error"}  # KServe's shape
    assert rest(server, "POST", "/v2/models/m/infer", V2).status == 200
    wrong_method = rest(server, "GET", "/predictions/m")
    assert wrong_method.status == 405 and wrong_method.json()["code"] == 405  # the router's 405, TorchServe's shape
    assert rest(server, "POST", "/predictions", b"x").json()["code"] == 404


def test_the_timing_fields_are_the_same_on_rest_and_grpc(server: InProcessServer) -> None:
    reply = rest(server, "POST", "/predictions/m", b"x")
    assert reply.headers["x-request-id"] and int(reply.headers[BATCH_SIZE]) == 1
    method = methods(TORCHSERVE_INFERENCE)["Predictions"]
    with grpc.insecure_channel(server.grpc_inference_target) as channel:
        stub = channel.unary_unary(method.path, request_serializer=method.request.SerializeToString,
                                   response_deserializer=method.response.FromString)
        _, trailers = stub.with_call(method.request(model_name="m", input={"data": b"x"}), timeout=30)
    trailing = dict(trailers.trailing_metadata())
    for fields in (reply.headers, trailing):
        assert float(fields[QUEUE_MS]) >= 0.0 and float(fields[HANDLER_MS]) >= 0.0 and fields[BATCH_SIZE] == "1"


def test_while_start_up_models_load_a_model_not_found_is_not_ready_on_every_transport(
    server: InProcessServer,
) -> None:
    readiness = server.server.readiness
    readiness.starting = True  # as while the start-up models load: "nope" may be one of them
    try:
        loading = "Model nope is not loaded yet"
        assert loading in rest(server, "POST", "/predictions/nope", b"x").json()["message"]
        v2 = rest(server, "POST", "/v2/models/nope/infer", V2)
        assert v2.status == 503 and loading in v2.json()["error"]
        assert rest(server, "GET", "/v2/models/nope").status == 503  # metadata
        assert rest(server, "GET", "/v2/models/nope/ready").json() == {"name": "nope", "ready": False}
        assert rest(server, "GET", "/v1/models/nope").status == 503
        assert rest(server, "GET", "/ping").status == 500
        grpc_predict = rpc(server, TORCHSERVE_INFERENCE, "Predictions", model_name="nope")
        assert grpc_predict.code() == grpc.StatusCode.UNAVAILABLE and loading in grpc_predict.details()
        assert rpc(server, OIP, "ModelMetadata", name="nope").code() == grpc.StatusCode.UNAVAILABLE
        assert rpc(server, OIP, "ModelReady", name="nope").ready is False
        assert rpc(server, OIP, "ServerReady").ready is False
    finally:
        readiness.starting = False
    assert rest(server, "POST", "/predictions/nope", b"x").status == 404
    assert rpc(server, OIP, "ModelReady", name="nope").code() == grpc.StatusCode.NOT_FOUND


def test_kserves_not_ready_refusal_is_the_same_on_rest_and_grpc(server: InProcessServer) -> None:
    found = server.fake.get("m")
    task, found.task = found.task, None  # its minimum of workers, none serving: not ready
    try:
        not_ready = "Model with name m is not ready."
        v1 = rest(server, "POST", "/v1/models/m:predict", b'{"instances": [{"data": "x"}]}')
        v2 = rest(server, "POST", "/v2/models/m/infer", V2)
        assert (v1.status, v1.json()) == (503, {"error": not_ready}) and v1.headers["retry-after"] == "1"
        assert (v2.status, v2.json()) == (503, {"error": not_ready})
        refused_grpc = rpc(server, OIP, "ModelInfer", model_name="m")
        assert (refused_grpc.code(), refused_grpc.details()) == (grpc.StatusCode.UNAVAILABLE, not_ready)
        # TorchServe's own routes keep TorchServe's behaviour: no worker to serve it
        assert "has no worker" in rest(server, "POST", "/predictions/m", b"x").json()["message"]
    finally:
        found.task = task
    assert answered(rest(server, "POST", "/v2/models/m/infer", V2))
