"""KServe v1 and the Open Inference Protocol v2 over REST: every endpoint, batching under each protocol, each
protocol's errors, and a schema fuzz of the v2 API. In process (tests/inprocess.py): the real HTTP stack, gateway and
protocol modules, the handlers run by the worker runtime in this process over a fake backend. Both real backends
serve these protocols in tests/test_api_backends.py (the smoke suite), Triton's HTTP client talks to a real server in
tests/test_api_foreign_clients.py.

Models (tests/kserve_models.py): ``doubler``, a TorchServe-style BaseHandler for KServe's envelopes (batch 4, 200 ms
delay, 60 ms a batch, OIP metadata in its model-config.yaml); ``tensors``, servetune's tensors form (metadata from
its handler).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends import IN_PROCESS, backend_server
from http_client import Reply, burst, call
from inprocess import InProcessServer
from kserve_models import DOUBLER_METADATA, build_store
from servetune.tensors import InferenceRequest, RequestedOutput, Tensor, encode_request, parse_response

JSON = {"Content-Type": "application/json"}
LIMIT = 200_000


class Server:
    def __init__(self, server: InProcessServer, backend: str) -> None:
        self.server = server
        self.backend = backend
        self.url = server.inference_url

    def get(self, path: str) -> Reply:
        return call("GET", f"{self.url}{path}")

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Reply:
        return call("POST", f"{self.url}{path}", body, headers or JSON)


@pytest.fixture(scope="module", params=IN_PROCESS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    backend = request.param
    store = tmp_path_factory.mktemp("store")
    models = build_store(store)
    properties = {"default_workers_per_model": "1", "max_request_size": str(LIMIT)}
    running = backend_server(backend, tmp_path_factory, store, models, properties)
    try:
        yield Server(running.start(), backend)
    finally:
        running.stop()


def v2_body(data: list[float], name: str = "input-0", datatype: str = "FP32", **extra: object) -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": [1, len(data)], "datatype": datatype, "data": data}],
                       **extra}).encode()


def binary(request: InferenceRequest) -> tuple[bytes, dict[str, str]]:
    body, header_length = encode_request(request)
    return body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)}


def error_of(reply: Reply) -> str:
    payload = reply.json()
    assert list(payload) == ["error"], payload
    return str(payload["error"])


# ---- KServe v1 -------------------------------------------------------------------------------


def test_v1_lists_models_and_says_whether_each_is_ready(server: Server) -> None:
    assert server.get("/v1/models").json() == {"models": ["doubler", "tensors"]}
    assert (server.get("/v1/models/doubler").status, server.get("/v1/models/doubler").json()) == (
        200,
        {"name": "doubler", "ready": True},
    )
    unknown = server.get("/v1/models/nope")
    assert unknown.status == 404 and "nope" in error_of(unknown)


def test_v1_predict_hands_the_handler_the_instances_and_answers_predictions(server: Server) -> None:
    reply = server.post("/v1/models/doubler:predict", json.dumps({"instances": [[1, 2], [3, 4]]}).encode())
    assert reply.status == 200, reply.body
    assert reply.json() == {"predictions": [[2.0, 4.0], [6.0, 8.0]]}
    columnar = server.post("/v1/models/doubler:predict", json.dumps({"inputs": [[5, 6]]}).encode())
    assert columnar.json() == {"predictions": [[10.0, 12.0]]}


def test_v1_explain_is_the_handlers_or_a_501(server: Server) -> None:
    reply = server.post("/v1/models/doubler:explain", json.dumps({"instances": [[1, 2]]}).encode())
    assert reply.status == 501 and "does not provide explanations" in error_of(reply)


def test_v1_bad_requests_get_kserve_errors(server: Server) -> None:
    cases = {
        b"not json": (400, "not valid JSON"),
        b'{"instance": [1]}': (400, "instances"),
        b'{"instances": 3}': (400, "instances"),
        b'{"instances": ["boom"]}': (500, "Prediction failed: ValueError: boom requested"),  # the handler's error
        b'{"instances": [{"a": 1}]}': (400, "rows must be"),
        b'{"instances": [' + b"1," * LIMIT + b"1]}": (413, "max_request_size"),
    }
    for body, (status, message) in cases.items():
        reply = server.post("/v1/models/doubler:predict", body)
        assert reply.status == status and message in error_of(reply), (body[:40], reply.status, reply.body)
    assert server.post("/v1/models/nope:predict", b'{"instances": []}').status == 404


# ---- OIP v2: health, metadata ----------------------------------------------------------------


def test_v2_health_and_server_metadata(server: Server) -> None:
    assert (server.get("/v2/health/live").status, server.get("/v2/health/live").json()) == (200, {"live": True})
    assert (server.get("/v2/health/ready").status, server.get("/v2/health/ready").json()) == (200, {"ready": True})
    meta = server.get("/v2").json()
    assert meta["name"] == "servetune" and meta["version"] and "binary_tensor_data" in meta["extensions"]
    assert server.get("/v2/models").json() == {"models": ["doubler", "tensors"]}


def test_v2_model_metadata_comes_from_model_config_or_the_handler(server: Server) -> None:
    declared = server.get("/v2/models/doubler").json()
    assert declared == {"name": "doubler", "versions": ["1.0"], **DOUBLER_METADATA}
    assert server.get("/v2/models/doubler/versions/1.0").json() == declared
    handler = server.get("/v2/models/tensors").json()
    assert handler["platform"] == "numpy_tensors"
    assert [t["name"] for t in handler["outputs"]] == ["y", "batch"]
    for path in ("/v2/models/nope", "/v2/models/doubler/versions/9.9", "/v2/models/nope/ready"):
        reply = server.get(path)
        assert reply.status == 404 and error_of(reply), (path, reply.body)


def test_v2_model_ready(server: Server) -> None:
    for path in ("/v2/models/doubler/ready", "/v2/models/doubler/versions/1.0/ready"):
        reply = server.get(path)
        assert (reply.status, reply.json()) == (200, {"name": "doubler", "ready": True})


# ---- OIP v2: inference -----------------------------------------------------------------------


def test_v2_infer_json_as_torchserves_kservev2_envelope_answers(server: Server) -> None:
    reply = server.post("/v2/models/doubler/infer", v2_body([1, 2], id="d3b15cad"))
    assert reply.status == 200, reply.body
    assert reply.json() == {
        "model_name": "doubler",
        "model_version": "1.0",
        "id": "d3b15cad",
        "outputs": [{"name": "input-0", "datatype": "FP64", "shape": [2], "data": [2.0, 4.0]}],
    }
    assert reply.headers["content-type"] == "application/json"
    versioned = server.post("/v2/models/doubler/versions/1.0/infer", v2_body([3, 4]))
    assert versioned.json()["outputs"][0]["data"] == [6.0, 8.0] and versioned.json()["id"]


def test_v2_infer_binary_both_ways_with_parameters_and_chosen_outputs(server: Server) -> None:
    x = np.array([1.5, -2.0, 4.0], dtype=np.float32)
    request = InferenceRequest(
        [Tensor.from_array("x", x)],
        id="req-7",
        parameters={"tag": "hello"},
        outputs=[RequestedOutput("y", {"binary_data": True}), RequestedOutput("echo")],
    )
    body, headers = binary(request)
    reply = server.post("/v2/models/tensors/infer", body, headers)
    assert reply.status == 200, reply.body
    header_length = int(reply.headers["inference-header-content-length"])
    assert reply.headers["content-type"] == "application/octet-stream"
    response = parse_response(reply.body, header_length)
    assert (response.id, [t.name for t in response.outputs]) == ("req-7", ["y", "echo"])
    assert response.outputs[0].data.tolist() == (x * 2).tolist()
    assert response.outputs[1].data.tolist() == [b"hello", b"False"]  # parameters reached the handler
    everything = InferenceRequest([Tensor.from_array("x", x)], parameters={"binary_data_output": True})
    body, headers = binary(everything)
    reply = server.post("/v2/models/tensors/infer", body, headers)
    header = json.loads(reply.body[: int(reply.headers["inference-header-content-length"])])
    assert all("binary_data_size" in out["parameters"] for out in header["outputs"])
    missing = InferenceRequest([Tensor.from_array("x", x)], outputs=[RequestedOutput("nope")])
    reply = server.post("/v2/models/tensors/infer", *binary(missing))
    assert reply.status == 400 and "nope" in error_of(reply)


def test_v2_gzip_request_bodies_are_read(server: Server) -> None:
    reply = server.post("/v2/models/doubler/infer", gzip.compress(v2_body([1, 1])),
                        {**JSON, "Content-Encoding": "gzip"})
    assert reply.status == 200 and reply.json()["outputs"][0]["data"] == [2.0, 2.0]


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (v2_body([1, 2, 3])[:-30] + b"}", JSON, 400, "not valid JSON"),
        (json.dumps({"inputs": [{"name": "input-0", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}).encode(),
         JSON, 400, "holds 3 elements"),
        (v2_body([1, 2], datatype="FP9"), JSON, 400, "FP9"),
        (v2_body([1.5, 2], datatype="INT32"), JSON, 400, "floats, not INT32"),
        (b"{}", JSON, 400, "inputs"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}'
         + b"\x00\x00", None, 400, "only 2 bytes"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}'
         + b"\x00" * 4, JSON, 400, "Inference-Header-Content-Length"),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, 400, "not within the body"),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "ten"}, 400, "not a length"),
        (v2_body([1, 2]), {**JSON, "Content-Encoding": "br"}, 415, "Content-Encoding"),
        (v2_body([1.0] * LIMIT), JSON, 413, "max_request_size"),
        (json.dumps({"inputs": [{"name": "b", "shape": [1], "datatype": "BYTES", "data": ["boom"]}]}).encode(),
         JSON, 500, "Prediction failed: ValueError: boom requested"),
    ],
    ids=["truncated-json", "shape", "datatype", "int-values", "no-inputs", "truncated-binary", "missing-header",
         "header-too-long", "header-not-a-number", "encoding", "oversize", "handler-failure"],
)
def test_v2_bad_requests_get_oip_errors(
    server: Server, body: bytes, headers: dict[str, str] | None, status: int, message: str
) -> None:
    if headers is None:  # the binary case: the header says where the JSON ends
        headers = {"Inference-Header-Content-Length": str(body.index(b"}]}") + 3)}
    reply = server.post("/v2/models/doubler/infer", body, headers)
    assert reply.status == status and message in error_of(reply), (reply.status, reply.body)


def test_v2_unknown_models_and_versions_are_404(server: Server) -> None:
    for path in ("/v2/models/nope/infer", "/v2/models/doubler/versions/9.9/infer"):
        reply = server.post(path, v2_body([1, 2]))
        assert reply.status == 404 and error_of(reply), reply.body


# ---- batching under every protocol -----------------------------------------------------------


def sizes(replies: list[Reply]) -> list[int]:
    assert all(r.status == 200 for r in replies), [(r.status, r.body[:200]) for r in replies]
    return [int(r.headers["x-servetune-batch-size"]) for r in replies]


def test_v1_requests_are_batched_and_each_gets_its_own_answer(server: Server) -> None:
    bodies = [json.dumps({"instances": [[i, i + 1]]}).encode() for i in range(8)]
    replies = burst("POST", f"{server.url}/v1/models/doubler:predict", bodies, JSON)
    assert 1 < max(sizes(replies)) <= 4
    assert [r.json()["predictions"] for r in replies] == [[[2.0 * i, 2.0 * i + 2]] for i in range(8)]


def test_v2_json_requests_are_batched_and_each_gets_its_own_answer(server: Server) -> None:
    bodies = [v2_body([i, -i], id=f"r{i}") for i in range(8)]
    replies = burst("POST", f"{server.url}/v2/models/doubler/infer", bodies, JSON)
    assert 1 < max(sizes(replies)) <= 4
    assert [(r.json()["id"], r.json()["outputs"][0]["data"]) for r in replies] == [
        (f"r{i}", [2.0 * i, -2.0 * i]) for i in range(8)
    ]


def test_v2_binary_requests_are_batched_in_the_tensors_form(server: Server) -> None:
    requests = [InferenceRequest([Tensor.from_array("x", np.full(2, i, np.float32))]) for i in range(8)]
    encoded = [binary(r) for r in requests]
    headers = encoded[0][1]
    assert all(h == headers for _, h in encoded)  # same shapes: same header length
    replies = burst("POST", f"{server.url}/v2/models/tensors/infer", [b for b, _ in encoded], headers)
    assert 1 < max(sizes(replies)) <= 4
    for i, reply in enumerate(replies):
        outputs = {t.name: t.data.tolist() for t in parse_response(reply.body).outputs}
        assert outputs["y"] == [2.0 * i] * 2 and outputs["batch"] == [int(reply.headers["x-servetune-batch-size"])]


def test_the_metrics_count_v1_and_v2_requests(server: Server) -> None:
    server.post("/v2/models/doubler/infer", v2_body([1, 2]))
    text = call("GET", f"{server.server.metrics_url}/metrics").body.decode()
    counted = [line for line in text.splitlines()
               if line.startswith("ts_inference_requests_total") and 'model_name="doubler"' in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 1, text[:2000]


# ---- the served OpenAPI ----------------------------------------------------------------------


def test_the_api_description_has_the_v1_and_v2_routes(server: Server) -> None:
    paths = call("OPTIONS", f"{server.url}/").json()["paths"]
    for path in ("/v1/models/{model_name}:predict", "/v2/health/ready", "/v2/models/{model_name}/infer",
                 "/v2/models/{model_name}/versions/{model_version}/infer"):
        assert path in paths, sorted(paths)


def test_schemathesis_finds_no_fault_in_the_v2_api(server: Server, tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    if shutil.which("schemathesis") is None:
        pytest.skip("schemathesis is not installed")
    spec = call("OPTIONS", f"{server.url}/").json()
    for item in spec["paths"].values():  # reach a real model: its name is the only valid one
        for param in item.get("parameters", []):
            if param["name"] == "model_name":
                param["schema"] = {"type": "string", "enum": ["doubler"]}
            if param["name"] == "model_version":
                param["schema"] = {"type": "string", "enum": ["1.0"]}
    spec_file = tmp_path / "inference.json"
    spec_file.write_text(json.dumps(spec))
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run", str(spec_file), "--url", server.url,
        "--include-path-regex", "^/v[12]", "--exclude-path-regex", "explain$",  # 501 by design: the doubler has none
        "--checks", "not_a_server_error,status_code_conformance,response_schema_conformance",
        "--max-examples", "15", "--seed", "1", "--workers", "1", "--phases", "examples,coverage,fuzzing",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert server.get("/v2/health/ready").status == 200
