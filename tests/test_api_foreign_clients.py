"""Clients nobody on this project wrote, against one real server with its defaults (issue 18, items 1-3).

- Triton's HTTP client: health, metadata, inference in binary and JSON, its errors (``doubler``, ``tensors``).
- Triton's gRPC client against the OIP gRPC service: health, metadata, raw and typed contents, errors (``stream``).
- Triton's client into the built-in ``image_classifier`` with no ``service_envelope`` set: HTTP with the image
  binary, HTTP JSON with it base64-encoded, gRPC with it in ``raw_input_contents`` (each the first BYTES element, as
  TorchServe's ``kservev2`` envelope handed it to a raw-bytes handler), answered as ``/predictions`` answers.
- KServe's SDK (``InferenceRESTClient`` v1 and v2, ``InferenceGRPCClient``): liveness (v1's ``GET /``), readiness,
  and a model that is not ready: its ``:predict`` / ``infer`` / ``ModelInfer`` refused at once (503, UNAVAILABLE),
  not held until its worker comes up.

KServe's SDK and Triton's gRPC client pin protobuf < 7: they run in venvs of their own (scripts/client_venv), built
once per machine; their tests are skipped when a venv cannot be built (no package index).
"""

from __future__ import annotations

import base64
import io
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from PIL import Image

from grpc_models import generate_stubs, tensor_archive
from http_client import call
from kserve_models import DOUBLER_METADATA, build_store
from models import handler_archive
from servetune.archive import create_archive
from servetune.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[1]
TINY_CNN = textwrap.dedent(
    """
    import torch

    class TinyCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.head = torch.nn.Linear(8, 10)

        def forward(self, x):
            return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))
    """
)
# Answers a KServe v1 instance or an OIP v2 input (the kservev2 envelope's dict) doubled; loads in load_s seconds.
ECHO = textwrap.dedent(
    """
    import time

    import numpy as np

    def handle(data, context):
        if data is None:
            time.sleep(float(context.model_yaml_config.get("load_s", 0)))
            return None
        return [(np.asarray(i.get("data") if isinstance(i, dict) else i, dtype=float) * 2).tolist() for i in data]
    """
)


def image_archive(store: Path, src: Path) -> None:
    src.mkdir()
    (src / "model.py").write_text(TINY_CNN)
    namespace: dict[str, Any] = {}
    exec(TINY_CNN, namespace)  # the class the archive carries, with weights of a fixed seed
    torch.manual_seed(0)
    torch.save(namespace["TinyCNN"]().state_dict(), src / "weights.pt")
    create_archive(model_name="img", version="1.0", handler="image_classifier", model_file=src / "model.py",
                   serialized_file=src / "weights.pt", export_path=store)


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def client_python(client: str) -> Path:
    built = subprocess.run([sys.executable, str(ROOT / "scripts" / "client_venv"), client], capture_output=True,
                           text=True)
    if built.returncode != 0:
        pytest.skip(f"the {client} venv could not be built: {built.stderr[-500:]}")
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("store")
    image_archive(store, tmp_path_factory.mktemp("src") / "img")
    handler_archive(store, "echo", "echo.py", ECHO, {})
    handler_archive(store, "loading", "echo.py", ECHO, {"load_s": 60})
    tensor_archive(store, "stream", batch_ms=0, model_config={"batchSize": 1, "maxBatchDelay": 0})
    kserve = build_store(store, batch_ms=0)  # doubler, tensors
    properties = {"default_workers_per_model": "1", "disable_token_authorization": "true", "enable_model_api": "true"}
    models = {"img": "img.mar", "echo": "echo.mar", "stream": "stream.mar", **kserve}
    with EmbeddedServer(store, models, properties) as running:
        yield running


def predictions(server: EmbeddedServer, image: bytes) -> Any:
    reply = call("POST", f"{server.inference_url}/predictions/img", image)
    assert reply.status == 200, reply.body
    return reply.json()


# ---- Triton's clients: the Open Inference Protocol over HTTP and gRPC ---------------------------------


@pytest.mark.parametrize("binary_data", [True, False], ids=["binary", "json"])
def test_tritons_http_client_talks_to_servetune(server: EmbeddedServer, binary_data: bool) -> None:
    triton = pytest.importorskip("tritonclient.http")
    client = triton.InferenceServerClient(server.inference_url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("doubler") and client.is_model_ready("tensors", "1.0")
        assert not client.is_model_ready("nope")
        assert client.get_server_metadata()["name"] == "servetune"
        assert client.get_model_metadata("doubler")["inputs"] == DOUBLER_METADATA["inputs"]
        x = np.array([1.0, 2.5, -3.0], dtype=np.float32)
        given = triton.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x, binary_data=binary_data)
        wanted = [triton.InferRequestedOutput(name, binary_data=binary_data) for name in ("y", "echo")]
        result = client.infer("tensors", [given], outputs=wanted, request_id="t-1", parameters={"tag": "tc"})
        assert result.get_response()["id"] == "t-1"
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        echo = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("echo").tolist()]
        assert echo == ["tc", "False"]  # JSON BYTES come back as str, binary ones as bytes
        # no outputs named: the client asks for every output in binary
        doubled = client.infer("doubler", [_triton_input(triton, np.ones((1, 2), np.float32), binary_data)])
        np.testing.assert_array_equal(doubled.as_numpy("input-0"), [2.0, 2.0])
        with pytest.raises(triton.InferenceServerException, match="Prediction failed"):
            bad = triton.InferInput("input-0", [1], "BYTES")
            bad.set_data_from_numpy(np.array([b"boom"], dtype=object), binary_data=binary_data)
            client.infer("doubler", [bad])
        with pytest.raises(triton.InferenceServerException, match="nope"):
            client.infer("nope", [given])
    finally:
        client.close()


def _triton_input(triton: object, array: np.ndarray, binary_data: bool) -> object:
    given = triton.InferInput("input-0", list(array.shape), "FP32")  # type: ignore[attr-defined]
    given.set_data_from_numpy(array, binary_data=binary_data)
    return given


def test_tritons_grpc_client_talks_to_the_oip_grpc_service(server: EmbeddedServer) -> None:
    python = client_python("tritonclient")
    script = Path(__file__).with_name("triton_grpc_client.py")
    run = subprocess.run([str(python), str(script), server.grpc_inference_target, "stream"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert (seen["live"], seen["ready"], seen["model_ready"]) == (True, True, True)
    assert seen["server"]["name"] == "servetune"
    assert seen["metadata"]["name"] == "stream" and seen["metadata"]["versions"] == ["1.0"]
    assert seen["raw"] == {"y": [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]], "id": "t1"}
    assert seen["bytes"] == ["hello", "world"]
    assert seen["typed"] == {"y": [2, 4, 6], "raw": 0}
    assert seen["errors"] == {"unknown_model": "StatusCode.NOT_FOUND", "wrong_shape": "StatusCode.INVALID_ARGUMENT"}


# ---- Triton's client into TorchServe's image_classifier ------------------------------------------


def test_triton_http_sends_an_image_binary_and_base64_into_the_image_classifier(server: EmbeddedServer) -> None:
    triton = pytest.importorskip("tritonclient.http")
    image = jpeg(1)
    expected = predictions(server, image)
    assert len(expected) == 5
    client = triton.InferenceServerClient(server.inference_url.removeprefix("http://"), concurrency=8)
    try:

        def data(element: bytes, binary: bool) -> Any:
            tensor = triton.InferInput("data", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([element], dtype=np.object_), binary_data=binary)
            return tensor

        def answer(result: Any) -> Any:
            assert result.get_response()["outputs"][0]["shape"] == [1]
            return json.loads(result.as_numpy("data")[0])

        assert answer(client.infer("img", [data(image, True)])) == expected
        assert answer(client.infer("img", [data(base64.b64encode(image), False)])) == expected
        # eight at once, as JSON (the client's own concurrency): every one answered
        pending = [client.async_infer("img", [data(base64.b64encode(image), False)]) for _ in range(8)]
        assert [answer(p.get_result()) for p in pending] == [expected] * 8
    finally:
        client.close()


def test_a_batch_dimension_and_several_inputs_reach_the_image_classifier_one_image_each(
    server: EmbeddedServer,
) -> None:
    triton = pytest.importorskip("tritonclient.http")
    images = [jpeg(3), jpeg(4)]
    expected = [predictions(server, image) for image in images]
    client = triton.InferenceServerClient(server.inference_url.removeprefix("http://"))
    try:
        batch = triton.InferInput("data", [2], "BYTES")  # two images in one tensor: two answers in one output
        batch.set_data_from_numpy(np.array(images, dtype=np.object_))
        result = client.infer("img", [batch])
        assert result.get_response()["outputs"][0]["shape"] == [2]
        assert [json.loads(a) for a in result.as_numpy("data")] == expected
        pair = []  # two inputs of one image each: an output named after each input
        for name, image in zip(("first", "second"), images, strict=True):
            pair.append(triton.InferInput(name, [1], "BYTES"))
            pair[-1].set_data_from_numpy(np.array([image], dtype=np.object_))
        result = client.infer("img", pair)
        assert [json.loads(result.as_numpy(name)[0]) for name in ("first", "second")] == expected
    finally:
        client.close()


def test_triton_grpc_sends_an_image_as_raw_contents_into_the_image_classifier(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    python = client_python("tritonclient")
    image = tmp_path / "kitten.jpg"
    image.write_bytes(jpeg(2))
    script = Path(__file__).with_name("triton_grpc_client.py")
    run = subprocess.run([str(python), str(script), server.grpc_inference_target, "img", "image", str(image)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"name": "data", "shape": [1], "answer": predictions(server, image.read_bytes())}


# ---- KServe's SDK: liveness, readiness, not ready --------------------------------------------------


def test_kserve_sdk_liveness_readiness_and_a_model_not_ready_refused_at_once(server: EmbeddedServer) -> None:
    python = client_python("kserve")
    script = Path(__file__).with_name("kserve_sdk_client.py")
    args = [str(python), str(script), server.inference_url, server.grpc_inference_target, "echo", "loading"]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as client:
        assert client.stdin is not None and client.stdout is not None
        ready = json.loads(client.stdout.readline() or "null")
        if ready is None:  # the client failed: say how
            pytest.fail(f"KServe's client failed:\n{client.communicate(timeout=60)[1][-3000:]}")
        register = "/models?url=loading.mar&initial_workers=1&synchronous=false"
        registered = call("POST", f"{server.management_url}{register}")
        client.stdin.write("go\n")
        client.stdin.flush()
        loading = json.loads(client.stdout.readline() or "null")
        _, errors = client.communicate(timeout=120)
    call("DELETE", f"{server.management_url}/models/loading")
    assert loading is not None, errors[-3000:]
    assert registered.status == 202
    assert ready["v1"] == {"live": True, "model_ready": True, "predict": {"predictions": [[2.0, 4.0]]}}
    assert ready["v2"] == {"live": True, "ready": True, "model_ready": True, "infer": {"id": "k1", "y": [2.0, 4.0]}}
    assert ready["grpc"] == {"live": True, "ready": True, "model_ready": True, "infer": {"id": "k1", "y": [2.0, 4.0]}}

    not_ready = "Model with name loading is not ready."
    assert loading["v1"]["live"] is True and loading["v1"]["model_ready"] is False
    assert loading["v1"]["other_model_ready"] is True
    assert loading["v1"]["predict"][:2] == [503, not_ready]
    assert loading["v2"]["live"] is True and loading["v2"]["model_ready"] is False
    assert loading["v2"]["ready"][0] == 503  # the server is not ready while a model is not
    assert loading["v2"]["infer"][:2] == [503, not_ready]
    assert (loading["grpc"]["live"], loading["grpc"]["ready"], loading["grpc"]["model_ready"]) == (True, False, False)
    assert loading["grpc"]["infer"][:2] == ["UNAVAILABLE", not_ready]
    for refused in (loading["v1"]["predict"], loading["v2"]["infer"], loading["grpc"]["infer"]):
        assert refused[2] < 10.0, refused  # at once: the worker takes 60 s to load


# ---- TorchServe's gRPC clients: the differences docs/torchserve-compat.md lists ----------------------

COMPAT_PAGE = ROOT / "docs" / "torchserve-compat.md"
GRPC_SECTION = "## TorchServe's gRPC APIs"


def page_table(heading: str) -> dict[str, list[str]]:
    """The rows of the first table under ``heading`` of the compatibility page: first cell -> the other cells."""
    text = COMPAT_PAGE.read_text()
    section = text[text.index(heading) :].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and the rule
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    return {row[0]: row[1:] for row in cells}


@pytest.fixture(scope="module")
def torchserve_grpc(server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pb = generate_stubs(tmp_path_factory.mktemp("stubs"))
    inference = grpc.insecure_channel(server.grpc_inference_target)
    management = grpc.insecure_channel(server.grpc_management_target)

    class Clients:
        stubs: dict[str, ModuleType] = pb
        infer = pb["inference_pb2_grpc"].InferenceAPIsServiceStub(inference)
        manage = pb["management_pb2_grpc"].ManagementAPIsServiceStub(management)

    yield Clients
    inference.close()
    management.close()


def grpc_call(call: Callable[[], Any]) -> tuple[str, Any]:
    """(status code name, the answer or the error's details)."""
    try:
        return "OK", call()
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()


def test_every_grpc_difference_on_the_compat_page_is_what_the_server_does(torchserve_grpc: Any) -> None:
    infer, manage, pb = torchserve_grpc.infer, torchserve_grpc.manage, torchserve_grpc.stubs
    predictions, stream = pb["inference_pb2"].PredictionsRequest, infer.StreamPredictions

    def predict(model: str, data: bytes) -> Any:
        return infer.Predictions(predictions(model_name=model, input={"data": data}), timeout=60)

    def stream_all(model: str, data: bytes) -> list[bytes]:
        return [m.prediction for m in stream(predictions(model_name=model, input={"data": data}), timeout=60)]

    def models(**fields: Any) -> Any:
        return json.loads(manage.ListModels(pb["management_pb2"].ListModelsRequest(**fields), timeout=60).msg)

    def described(model: str = "echo", **fields: Any) -> Any:
        request = pb["management_pb2"].DescribeModelRequest(model_name=model, **fields)
        return json.loads(manage.DescribeModel(request, timeout=60).msg)[0]

    def register_again() -> Any:
        return manage.RegisterModel(pb["management_pb2"].RegisterModelRequest(url="echo.mar"), timeout=60)

    total = len(models()["models"])
    checks: dict[str, Callable[[], tuple[str, Any]]] = {
        "`Predictions` of an undecodable image (`image_classifier`)": lambda: grpc_call(lambda: predict("img", b"x")),
        '`Predictions` with `model_name: ""`': lambda: grpc_call(lambda: predict("", b"x")),
        "`RegisterModel` of a version already registered": lambda: grpc_call(register_again),
        "`StreamPredictions` to an unknown model": lambda: grpc_call(lambda: stream_all("nope", b"x")),
        "`StreamPredictions` to a handler that sends no intermediate answer": lambda: grpc_call(
            lambda: stream_all("echo", b"[1]")
        ),
        "`Predictions` (unary) to a handler that streams": lambda: grpc_call(lambda: predict("stream", b"stream:2")),
        "`ListModels` whose last page is full": lambda: grpc_call(lambda: models(limit=total)),
        "`DescribeModel`": lambda: grpc_call(described),
    }
    table = page_table(GRPC_SECTION)
    assert set(table) == set(checks), "the page's gRPC table and this test name different cases"
    seen = {case: check() for case, check in checks.items()}
    for case, (code, _) in seen.items():
        documented = re.match(r"[A-Z_]+", table[case][1])
        assert documented is not None and code == documented.group(0), (case, code, table[case][1])
    # What the page says beyond the code:
    assert "not a decodable image" in seen["`Predictions` of an undecodable image (`image_classifier`)"][1]
    unary = predict("echo", b"[1]").prediction
    assert seen["`StreamPredictions` to a handler that sends no intermediate answer"][1] == [unary]
    assert seen["`Predictions` (unary) to a handler that streams"][1].prediction.startswith(b"done after 2")
    assert "nextPageToken" not in seen["`ListModels` whose last page is full"][1]
    assert models(limit=1)["nextPageToken"] == "1"  # a page that is not the last one says where the next starts
    described_echo = seen["`DescribeModel`"][1]
    assert "maxNumSequence" not in described_echo and "maxSequenceJobQueueSize" not in described_echo
    # as TorchServe: a BaseHandler without describe_handle of its own gives {}
    assert described("img", customized=True)["customizedMetadata"] == {}
