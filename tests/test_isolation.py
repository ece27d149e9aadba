"""Nothing one client sends changes how another client's request is handled (issue 19, item 1), on a real server.

Each attack is sent inside a real batch: the attacker first, then three victims, to a model batching 4 requests (a
long ``maxBatchDelay``, so the batch closes when the fourth arrives); every answer says ``X-Servetune-Batch-Size: 4``
(with only these four requests in flight, all four shared one batch). The handler (``Echo``, a TorchServe
``BaseHandler``, which reads request 0's ``explain``/``describe`` header for the whole call) echoes each request's own
token, whether it ran as a prediction or an explanation, and the control headers it saw.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from http_client import call
from models import handler_archive
from servetune.embedded import EmbeddedServer
from servetune.protos import TORCHSERVE_INFERENCE, methods
from servetune.timing import BATCH_SIZE

BATCH = 4

ECHO = textwrap.dedent(
    """
    import json

    from ts.torch_handler.base_handler import BaseHandler


    def token_of(row):
        value = row
        if isinstance(row, dict):
            value = row.get("data") if row.get("data") is not None else row.get("body", row)
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode()
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        return value.get("token") if isinstance(value, dict) else value


    class Echo(BaseHandler):
        def initialize(self, context):
            self.context = context
            self.manifest = context.manifest
            self.initialized = True

        def preprocess(self, data):
            return [token_of(row) for row in data]

        def inference(self, data, *args, **kwargs):
            return data

        def seen(self, i):
            headers = self.context.get_all_request_header(i)
            servetune = sorted(k for k in headers if str(k).lower().startswith("x-servetune"))
            return {"explain": headers.get("explain"), "describe": headers.get("describe"), "servetune": servetune}

        def postprocess(self, data):
            return [{"kind": "prediction", "token": t, **self.seen(i)} for i, t in enumerate(data)]

        def explain_handle(self, data_preprocess, raw_data):
            return [{"kind": "explanation", "token": t} for t in data_preprocess]

        def describe_handle(self):
            return {"kind": "description"}
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("store")
    handler_archive(store, "echo", "echo_handler.py", ECHO, {"batchSize": BATCH, "maxBatchDelay": 5000})
    properties = {"default_workers_per_model": "1", "disable_token_authorization": "true"}
    running = EmbeddedServer(store, {"echo": "echo.mar"}, properties, workdir=tmp_path_factory.mktemp("server"))
    running.start()
    try:
        yield running
    finally:
        running.stop()


# ---- one request of each protocol: (status, the handler's answer for it, the batch size it ran in) ----------------

Answer = tuple[int, Any, int]


def rest(server: EmbeddedServer, route: str, token: str, headers: dict[str, str] | None = None) -> Answer:
    """TorchServe's ``/predictions`` or ``/explanations``."""
    body = json.dumps({"token": token}).encode()
    reply = call("POST", f"{server.inference_url}/{route}/echo", body, {"Content-Type": "application/json",
                                                                        **(headers or {})})
    return reply.status, reply.json(), int(reply.headers.get("x-servetune-batch-size", 0))


def v1(server: EmbeddedServer, verb: str, token: str, headers: dict[str, str] | None = None) -> Answer:
    """KServe v1 ``:predict`` / ``:explain``: the one instance's answer."""
    body = json.dumps({"instances": [{"token": token}]}).encode()
    reply = call("POST", f"{server.inference_url}/v1/models/echo:{verb}", body, {"Content-Type": "application/json",
                                                                                 **(headers or {})})
    payload = reply.json()
    key = {"predict": "predictions", "explain": "explanations"}[verb]
    answer = payload[key][0] if reply.status == 200 and key in payload else payload
    return reply.status, answer, int(reply.headers.get("x-servetune-batch-size", 0))


def v2(server: EmbeddedServer, verb: str, token: str, headers: dict[str, str] | None = None) -> Answer:
    """OIP v2 ``infer`` / ``explain`` with a BYTES tensor holding the token (the kservev2 envelope)."""
    body = json.dumps({"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": [token]}]}).encode()
    reply = call("POST", f"{server.inference_url}/v2/models/echo/{verb}", body, {"Content-Type": "application/json",
                                                                                 **(headers or {})})
    payload = reply.json()
    answer = json.loads(payload["outputs"][0]["data"][0]) if reply.status == 200 else payload
    return reply.status, answer, int(reply.headers.get("x-servetune-batch-size", 0))


def grpc_predict(server: EmbeddedServer, token: str, metadata: tuple[tuple[str, str], ...] = ()) -> Answer:
    """TorchServe's gRPC ``Predictions``, with the batch size from the trailing metadata."""
    method = methods(TORCHSERVE_INFERENCE)["Predictions"]
    with grpc.insecure_channel(server.grpc_inference_target) as channel:
        stub = channel.unary_unary(
            method.path, request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        request = method.request(model_name="echo", input={"data": json.dumps({"token": token}).encode()})
        try:
            response, rpc = stub.with_call(request, metadata=metadata, timeout=60)
        except grpc.RpcError as exc:
            return 500, exc.details(), 0
    trailing = dict(rpc.trailing_metadata() or ())
    return 200, json.loads(response.prediction), int(trailing.get(BATCH_SIZE, 0))


def in_one_batch(attacker: Callable[[], Answer], victims: list[Callable[[], Answer]]) -> tuple[Answer, list[Answer]]:
    """The attacker's request first, then the victims', all in one batch (checked: every answer ran in a batch of
    4, and only these 4 requests were sent)."""
    assert len(victims) == BATCH - 1
    answers: list[Answer | None] = [None] * BATCH
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], Answer]) -> None:
        try:
            answers[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(0, attacker))]
    threads[0].start()
    time.sleep(0.2)  # the attacker's request opens the batch: it is request 0, the one a BaseHandler reads
    threads += [threading.Thread(target=run, args=(i + 1, fn)) for i, fn in enumerate(victims)]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert all(a is not None and a[2] == BATCH for a in answers), f"not one batch of {BATCH}: {answers}"
    return answers[0], answers[1:]  # type: ignore[return-value]


def assert_predicted(answer: Answer, token: str) -> None:
    status, body, _ = answer
    assert status == 200, answer
    assert body["kind"] == "prediction" and body["token"] == token, answer
    assert body["explain"] == "False" and body["describe"] is None and body["servetune"] == [], answer


def victims_of(server: EmbeddedServer) -> list[Callable[[], Answer]]:
    """A victim on each inference protocol: TorchServe REST, KServe v1, OIP v2."""
    return [
        lambda: rest(server, "predictions", "victim-rest"),
        lambda: v1(server, "predict", "victim-v1"),
        lambda: v2(server, "infer", "victim-v2"),
    ]


def check_victims(victims: list[Answer]) -> None:
    for answer, token in zip(victims, ["victim-rest", "victim-v1", "victim-v2"], strict=True):
        assert_predicted(answer, token)


# ---- the attacks ---------------------------------------------------------------------------------------------------

CONTROL_HEADERS = {"describe": "True", "explain": "True", "x-servetune-protocol": "oip-metadata"}


@pytest.mark.parametrize("header", sorted(CONTROL_HEADERS))
def test_a_control_header_on_torchserves_route_changes_nobodys_answer(server: EmbeddedServer, header: str) -> None:
    attacker, victims = in_one_batch(
        lambda: rest(server, "predictions", "attacker", {header: CONTROL_HEADERS[header]}), victims_of(server)
    )
    assert_predicted(attacker, "attacker")  # the header did nothing to its own request either
    check_victims(victims)


def test_control_headers_on_kserve_routes_change_nobodys_answer(server: EmbeddedServer) -> None:
    attacker, victims = in_one_batch(lambda: v1(server, "predict", "attacker", CONTROL_HEADERS), victims_of(server))
    assert_predicted(attacker, "attacker")
    check_victims(victims)
    attacker, victims = in_one_batch(lambda: v2(server, "infer", "attacker", CONTROL_HEADERS), victims_of(server))
    assert_predicted(attacker, "attacker")
    check_victims(victims)


def test_control_metadata_on_grpc_changes_nobodys_answer(server: EmbeddedServer) -> None:
    metadata = (*CONTROL_HEADERS.items(), ("x-servetune-batch-size", "1"))
    attacker, victims = in_one_batch(lambda: grpc_predict(server, "attacker", metadata), victims_of(server))
    assert_predicted(attacker, "attacker")
    check_victims(victims)


def test_an_explanation_first_in_a_batch_is_not_everyones_answer(server: EmbeddedServer) -> None:
    attacker, victims = in_one_batch(lambda: rest(server, "explanations", "attacker"), victims_of(server))
    assert attacker[:2] == (200, {"kind": "explanation", "token": "attacker"})
    check_victims(victims)


def test_kserve_v1_explain_and_predict_never_share_a_handler_call(server: EmbeddedServer) -> None:
    predict = [lambda i=i: v1(server, "predict", f"v1-{i}") for i in range(BATCH - 1)]
    attacker, victims = in_one_batch(lambda: v1(server, "explain", "attacker"), predict)
    assert attacker[:2] == (200, {"kind": "explanation", "token": "attacker"})
    for i, answer in enumerate(victims):
        assert_predicted(answer, f"v1-{i}")


def test_oip_v2_explain_and_infer_never_share_a_handler_call(server: EmbeddedServer) -> None:
    infer = [lambda i=i: v2(server, "infer", f"v2-{i}") for i in range(BATCH - 1)]
    attacker, victims = in_one_batch(lambda: v2(server, "explain", "attacker"), infer)
    assert attacker[:2] == (200, {"kind": "explanation", "token": "attacker"})
    for i, answer in enumerate(victims):
        assert_predicted(answer, f"v2-{i}")


def test_a_clients_x_servetune_headers_have_no_effect(server: EmbeddedServer) -> None:
    """REST and gRPC alike: the handler never sees them, and the answer is the plain prediction."""
    spoofed = {"x-servetune-protocol": "kserve-v1", "x-servetune-queue-ms": "0", "X-Servetune-Explain": "True"}
    metadata = tuple((k.lower(), v) for k, v in spoofed.items())
    attacker, victims = in_one_batch(
        lambda: rest(server, "predictions", "spoofer-rest", spoofed),
        [lambda: grpc_predict(server, "spoofer-grpc", metadata), *victims_of(server)[:2]],
    )
    assert_predicted(attacker, "spoofer-rest")
    assert_predicted(victims[0], "spoofer-grpc")
    assert_predicted(victims[1], "victim-rest")
    assert_predicted(victims[2], "victim-v1")
