"""Request envelopes in the worker (servetune.handlers.envelopes), through ``load_service`` / ``Service.predict`` as a
worker runs them: TorchServe's kserve/kservev2 shapes (compared with TorchServe's own envelope code), whole batches
in one handler call, mixed protocols, bad requests, servetune's tensors form, ``service_envelope``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servetune.handlers.control import KSERVE_V1, OIP_V2, Control
from servetune.handlers.service import InputParam, Request, Response, Service, load_service
from servetune.tensors import (
    HEADER_LENGTH,
    InferenceRequest,
    RequestedOutput,
    Tensor,
    encode_request,
    parse_response,
)

DOUBLER = textwrap.dedent(
    """
    import torch
    from ts.torch_handler.base_handler import BaseHandler

    CALLS = []


    class Doubler(BaseHandler):
        def initialize(self, context):
            self.context = context
            self.manifest = context.manifest
            self.initialized = True

        def preprocess(self, data):
            CALLS.append(len(data))
            mode = self.context.model_yaml_config.get("mode")
            rows = [(row.get("data") or row.get("body")) if isinstance(row, dict) else row for row in data]
            if mode == "one":  # a handler that always answers one item (a multi-input model, say)
                return torch.as_tensor([sum(map(float, rows[0]))])
            return torch.stack([torch.as_tensor(row, dtype=torch.float64) for row in rows])

        def inference(self, data, *args, **kwargs):
            return data * 2

        def postprocess(self, data):
            return data.tolist()

        def model_metadata(self):
            return {"platform": "p", "inputs": [{"name": "a", "datatype": "FP32", "shape": [2]}]}
    """
)

TENSORS = textwrap.dedent(
    """
    import numpy as np
    from servetune.tensors import InferenceResponse, Tensor

    servetune_envelope = "tensors"


    def handle(data, context):
        if data is None:
            return None
        out = []
        for request in data:
            x = request.input("x").data
            kind = request.parameters.get("kind")
            if kind == "tensor":
                out.append(Tensor.from_array("t", x + 1))
            elif kind == "list":
                out.append([Tensor.from_array("a", x), Tensor.from_array("b", ["s"])])
            elif kind == "response":
                out.append(InferenceResponse("renamed", [Tensor.from_array("r", x)], "9", parameters={"p": 1}))
            elif kind == "array":
                out.append(x * 3)
            else:
                out.append({"y": x * 2, "n": np.array([len(data)])})
        return out
    """
)


def torchserve_envelope(name: str) -> Any:
    """TorchServe's own envelope module (pip ``torchserve``), loaded from its files without importing ``ts`` (whose
    ``__init__`` leaves a file open) as a package of its own."""
    import importlib
    import importlib.metadata
    import sys
    import types

    try:
        folder = importlib.metadata.distribution("torchserve").locate_file("ts/torch_handler/request_envelope")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchserve is not installed (the dev extra installs it)")
    package = types.ModuleType("torchserve_envelopes")
    package.__path__ = [str(folder)]
    sys.modules.setdefault("torchserve_envelopes", package)
    return importlib.import_module(f"torchserve_envelopes.{name}")


def service(tmp_path: Path, source: str, config: dict[str, Any] | None = None, envelope: str | None = None) -> Service:
    model_dir = tmp_path / f"model{len(list(tmp_path.glob('model*')))}"  # a fresh module each time
    model_dir.mkdir()
    (model_dir / "handler_mod.py").write_text(source)
    manifest = {"model": {"modelName": "m", "modelVersion": "2.0", "handler": "handler_mod.py"}}
    return load_service(model_dir=model_dir, manifest=manifest, model_name="m", gpu_id=None, batch_size=8,
                        model_yaml_config=config or {}, service_envelope=envelope)


def v2(request_id: str, inputs: list[Tensor], **extra: Any) -> Request:
    body, header_length = encode_request(InferenceRequest(inputs, **extra))
    headers = {HEADER_LENGTH.lower(): str(header_length)}
    return Request(request_id, headers, [InputParam("body", "application/octet-stream", body)], Control(OIP_V2))


def v1(request_id: str, payload: Any, explain: bool = False) -> Request:
    body = [InputParam("body", "application/json", json.dumps(payload).encode())]
    return Request(request_id, {}, body, Control(KSERVE_V1, explain=explain))


def outputs(response: Response) -> dict[str, Any]:
    assert response.status == 200, response.body
    parsed = parse_response(response.body, int(response.headers[HEADER_LENGTH]) if HEADER_LENGTH in response.headers
                            else None)
    return {t.name: t.data.tolist() for t in parsed.outputs}


def calls() -> list[int]:
    import handler_mod  # the model directory is on sys.path

    return handler_mod.CALLS  # type: ignore[no-any-return]


def test_one_v2_request_is_answered_as_torchserves_own_kservev2_envelope_answers(tmp_path: Path) -> None:
    KServev2Envelope = torchserve_envelope("kservev2").KServev2Envelope  # noqa: N806

    svc = service(tmp_path, DOUBLER)
    x = [[1.0, 2.0], [3.0, 4.0]]
    body = {"id": "d3b15cad", "inputs": [{"name": "input-0", "shape": [2, 2], "datatype": "FP32", "data": x}]}
    ours = json.loads(svc.predict([v2("r1", [Tensor.from_array("input-0", np.array(x, np.float32))],
                                      id="d3b15cad")])[0].body)
    context = svc.context
    context.request_ids = {0: "r1"}
    torchserve = KServev2Envelope(svc._entry_point.handle).handle([{"body": json.dumps(body).encode()}], context)[0]
    torchserve["outputs"] = [{**o, "shape": list(o["shape"])} for o in torchserve["outputs"]]
    assert ours == {**torchserve, "model_name": "m"}  # TorchServe takes the manifest's name; servetune the served one
    assert ours["outputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [4], "data": [2.0, 4.0, 6.0, 8.0]}]


def test_one_v1_request_is_answered_as_torchserves_own_kserve_envelope_answers(tmp_path: Path) -> None:
    KServeEnvelope = torchserve_envelope("kserve").KServeEnvelope  # noqa: N806

    svc = service(tmp_path, DOUBLER)
    payload = {"instances": [[1, 2], [3, 4]]}
    ours = json.loads(svc.predict([v1("r1", payload)])[0].body)
    context = svc.context
    context.request_ids = {0: "r1"}
    torchserve = KServeEnvelope(svc._entry_point.handle).handle([{"body": json.dumps(payload).encode()}], context)
    assert ours == torchserve[0] == {"predictions": [[2.0, 4.0], [6.0, 8.0]]}


def test_a_batch_of_v2_requests_is_one_handler_call_and_each_gets_its_answer(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER)
    calls().clear()
    batch = [
        v2("a", [Tensor.from_array("input-0", np.array([1.0, 1.0]))]),
        v2("b", [Tensor.from_array("p", np.array([2.0, 2.0])), Tensor.from_array("q", np.array([3.0, 3.0]))]),
        v2("c", [Tensor.from_array("input-0", np.array([4.0, 4.0]))], id="mine"),
    ]
    answers = svc.predict(batch)
    assert calls() == [4]  # one call, every input of every request: pytorch/serve#2158 fixed
    assert [outputs(a) for a in answers] == [
        {"input-0": [2.0, 2.0]},
        {"p": [4.0, 4.0], "q": [6.0, 6.0]},
        {"input-0": [8.0, 8.0]},
    ]
    assert [json.loads(a.body)["id"] for a in answers] == ["a", "b", "mine"]
    assert json.loads(answers[0].body)["model_version"] == "2.0"


def test_a_handler_answering_one_item_per_request_is_shared_out_per_request(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER, {"mode": "one"})
    pair = [Tensor.from_array("ids", np.array([1.0, 2.0])), Tensor.from_array("mask", np.array([1.0, 1.0]))]
    answers = svc.predict([v2("a", pair), v2("b", pair)])
    assert [outputs(a) for a in answers] == [{"ids": [6.0]}, {"ids": [6.0]}]


def test_answers_that_cannot_be_shared_out_run_each_request_alone(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER, {"mode": "one"})
    calls().clear()
    batch = [v1(f"r{i}", {"instances": [[i, 1], [0, 0], [0, 0]]}) for i in range(2)]  # 3 items each, 1 answer
    answers = svc.predict(batch)
    assert [json.loads(a.body) for a in answers] == [{"predictions": [2.0]}, {"predictions": [4.0]}]
    assert calls() == [6, 3, 3]


def test_a_mixed_batch_runs_each_protocol_through_its_envelope(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER)
    plain = Request("p", {}, [InputParam("body", "application/json", b"[5, 5]")])
    answers = svc.predict([v1("a", {"instances": [[1, 1]]}), plain, v2("b", [Tensor.from_array("x", [2.0, 2.0])])])
    assert json.loads(answers[0].body) == {"predictions": [[2.0, 2.0]]}
    assert json.loads(answers[1].body) == [10.0, 10.0]
    assert outputs(answers[2]) == {"x": [4.0, 4.0]}


def test_a_bad_request_fails_alone(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER)
    broken = Request("bad", {HEADER_LENGTH.lower(): "3"},
                     [InputParam("body", "application/octet-stream", b'{"inputs": 1}')], Control(OIP_V2))
    answers = svc.predict([broken, v1("nobody", {"instance": []}), v2("ok", [Tensor.from_array("x", [1.0])])])
    assert answers[0].status == 400 and "request bad" in json.loads(answers[0].body)["message"]
    assert answers[1].status == 400 and "instances" in json.loads(answers[1].body)["message"]
    assert outputs(answers[2]) == {"x": [2.0]}


def test_empty_instances_are_answered_without_the_handler(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER)
    calls().clear()
    assert json.loads(svc.predict([v1("e", {"instances": []})])[0].body) == {"predictions": []}
    assert calls() == []


def test_the_explain_control_chooses_explanations(tmp_path: Path) -> None:
    source = "def handle(data, context):\n    return None if data is None else [[len(data)] for _ in data]\n"
    svc = service(tmp_path, "servetune_explains = True\n" + source)
    assert json.loads(svc.predict([v1("e", {"instances": [1, 2]}, explain=True)])[0].body) == {
        "explanations": [[2], [2]]
    }
    refused = service(tmp_path, source).predict([v1("e", {"instances": [1, 2]}, explain=True)])[0]
    assert refused.status == 501 and "does not provide explanations" in json.loads(refused.body)["message"]


def test_service_envelope_applies_to_torchserves_routes(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER, envelope="kservev2")
    body = {"inputs": [{"name": "input-0", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}
    plain = Request("p", {}, [InputParam("body", "application/json", json.dumps(body).encode())])
    assert outputs(svc.predict([plain])[0]) == {"input-0": [2.0, 4.0]}
    describe = Request("d", {}, [InputParam("body", None, b"")], Control(describe=True))
    assert svc.predict([describe])[0].body == b"null"  # the management API's describe: no envelope
    plain = Request("p", {}, [InputParam("body", "application/json", b'{"instances": [[1, 1], {"b64": "AA=="}]}')])
    reprs = "def handle(data, context):\n    return None if data is None else [repr(d) for d in data]\n"
    svc = service(tmp_path, reprs, envelope="json")
    assert json.loads(svc.predict([plain])[0].body) == {"predictions": ["[1, 1]", "b'\\x00'"]}
    with pytest.raises(ValueError, match="service_envelope"):
        service(tmp_path, DOUBLER, envelope="soap")


def test_the_handlers_metadata_is_read_once_when_it_loads(tmp_path: Path) -> None:
    svc = service(tmp_path, DOUBLER)
    assert svc.metadata is not None and svc.metadata["platform"] == "p"  # what the worker reports when loaded
    unjsonable = (
        "def model_metadata():\n    return {'platform': object()}\n\n"
        "def handle(data, context):\n    return None if data is None else data\n"
    )
    assert service(tmp_path, unjsonable).metadata is None  # one the worker cannot send: none, not a failed load


def test_the_tensors_form_gets_requests_and_answers_with_any_tensor_shape(tmp_path: Path) -> None:
    svc = service(tmp_path, TENSORS)
    x = np.array([1.0, 2.0], np.float32)
    kinds = ["dict", "tensor", "list", "response", "array"]
    batch = [v2(k, [Tensor.from_array("x", x)], parameters={"kind": k}) for k in kinds]
    answers = svc.predict(batch)
    assert [outputs(a) for a in answers] == [
        {"y": [2.0, 4.0], "n": [5]},
        {"t": [2.0, 3.0]},
        {"a": [1.0, 2.0], "b": [b"s"]},
        {"r": [1.0, 2.0]},
        {"output-0": [3.0, 6.0]},
    ]
    renamed = json.loads(answers[3].body)
    assert (renamed["model_name"], renamed["model_version"], renamed["parameters"]) == ("renamed", "9", {"p": 1})
    wanted = v2("w", [Tensor.from_array("x", x)], outputs=[RequestedOutput("n", {"binary_data": True})])
    (answer,) = svc.predict([wanted])
    assert outputs(answer) == {"n": [1]} and answer.content_type == "application/octet-stream"


LENGTHS = textwrap.dedent(
    """
    def handle(data, context):
        if data is None:
            return None
        if context.model_yaml_config.get("one"):
            return [len(data)]
        return [{"got": row["data"] if isinstance(row["data"], str) else f"{len(row['data'])} bytes",
                 "shape": row["shape"]} for row in data]
    """
)


def test_a_bytes_tensor_of_several_elements_is_one_item_per_element_answered_in_one_output(tmp_path: Path) -> None:
    svc = service(tmp_path, LENGTHS)
    texts = Tensor.from_array("texts", np.array([b"a", b"bb", b"\xff"], dtype=object))
    single = Tensor.from_array("single", np.array([b"c"], dtype=object))
    [answer] = svc.predict([v2("r1", [texts, single])])
    got = outputs(answer)
    assert [json.loads(t) for t in got["texts"]] == [  # text when UTF-8, else the bytes
        {"got": "a", "shape": [1]}, {"got": "bb", "shape": [1]}, {"got": "1 bytes", "shape": [1]}
    ]
    assert [json.loads(t) for t in got["single"]] == [{"got": "c", "shape": [1]}]
    refusing = service(tmp_path, LENGTHS, {"one": True})
    [answer] = refusing.predict([v2("r2", [texts])])
    assert answer.status == 500
    message = json.loads(answer.body)["message"]
    assert "the handler answered 1 items for the 3 elements of the request's inputs" in message
