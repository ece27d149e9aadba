"""BaseHandler: model loading (eager, TorchScript, torch.export, ONNX), the default pipeline, bad inputs."""

from __future__ import annotations

import collections
import json
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from servetune._exceptions import HandlerError
from servetune.handlers import InputParam, Request, Service, load_service, uninstall_ts_alias
from servetune.handlers.control import Control
from servetune.handlers.metrics import MetricTypes

LINEAR_SOURCE = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
"""


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # load_service puts the model dir on sys.path and installs the ts alias: undo both for other tests
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    uninstall_ts_alias()


def reference_linear() -> torch.nn.Module:
    namespace: dict[str, Any] = {}
    exec(LINEAR_SOURCE, namespace)
    torch.manual_seed(0)
    return namespace["Net"]().eval()


def load(
    model_dir: Path, handler: str = "base_handler", yaml_config: dict[str, Any] | None = None, **model: str
) -> Service:
    manifest = {"model": {"modelName": "m", "modelVersion": "1", "handler": handler, **model}}
    return load_service(
        model_dir=model_dir,
        manifest=manifest,
        model_name="m",
        gpu_id=None,
        batch_size=8,
        model_yaml_config=yaml_config or {},
    )


def json_request(value: Any, request_id: str = "r") -> Request:
    return Request(request_id, {}, [InputParam("body", "application/json", json.dumps(value).encode())])


def eager_dir(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(LINEAR_SOURCE)
    torch.save(reference_linear().state_dict(), tmp_path / "weights.pth")
    return tmp_path


X = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]]


def expected(rows: list[list[float]]) -> torch.Tensor:
    with torch.no_grad():
        return reference_linear()(torch.tensor(rows))


def test_eager_model_file_and_state_dict(tmp_path: Path) -> None:
    service = load(eager_dir(tmp_path), serializedFile="weights.pth", modelFile="model.py")
    out = service.predict([json_request(X[0]), json_request(X[1])])
    assert [r.status for r in out] == [200, 200]
    got = torch.tensor([json.loads(r.body) for r in out])
    torch.testing.assert_close(got, expected(X))


STORAGE_PROBE = """
from servetune.handlers.base import BaseHandler

class Probe(BaseHandler):
    def handle(self, data, context):
        if data and data[0].get("body") in (b"files", "files"):
            return [[t.data_ptr() for t in self.model.state_dict().values()]]
        return super().handle(data, context)
"""


def mapped_from(path: Path) -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of ``path``."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path)):
            start, end = line.split()[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


@pytest.mark.parametrize("mmap", [True, False])
def test_eager_weights_are_mapped_from_the_file_unless_config_says_not(tmp_path: Path, mmap: bool) -> None:
    # mapped: the parameters are the file's pages (shared by every worker of the model); else a private copy
    (eager_dir(tmp_path) / "probe.py").write_text(STORAGE_PROBE)
    service = load(tmp_path, "probe.py", {"mmap_weights": mmap}, serializedFile="weights.pth", modelFile="model.py")
    [reply] = service.predict([Request("f", {}, [InputParam("body", "text/plain", b"files")])])
    ranges = mapped_from(tmp_path / "weights.pth")
    inside = [any(a <= ptr < b for a, b in ranges) for ptr in json.loads(reply.body)]
    assert inside and set(inside) == {mmap}
    got = torch.tensor([json.loads(r.body) for r in service.predict([json_request(X[0]), json_request(X[1])])])
    torch.testing.assert_close(got, expected(X))


def test_torchscript_model(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated in recent torch
        torch.jit.save(torch.jit.trace(reference_linear(), torch.ones(1, 4)), str(tmp_path / "model.pt"))
    service = load(tmp_path, serializedFile="model.pt")
    out = service.predict([json_request(row) for row in X])
    torch.testing.assert_close(torch.tensor([json.loads(r.body) for r in out]), expected(X))


def test_torch_export_model(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch")
    program = torch.export.export(reference_linear(), (torch.ones(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    service = load(tmp_path, serializedFile="model.pt2")
    out = service.predict([json_request(row) for row in X])
    torch.testing.assert_close(torch.tensor([json.loads(r.body) for r in out]), expected(X))


def test_onnx_model(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    ref = reference_linear()
    weight = numpy_helper.from_array(ref.fc.weight.detach().numpy().T.copy(), "W")
    bias = numpy_helper.from_array(ref.fc.bias.detach().numpy(), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "B"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
        initializer=[weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "model.onnx"))
    service = load(tmp_path, serializedFile="model.onnx")
    out = service.predict([json_request(row) for row in X])
    torch.testing.assert_close(torch.tensor([json.loads(r.body) for r in out]), expected(X))


def test_weights_only_refuses_pickled_objects_unless_config_allows(tmp_path: Path) -> None:
    eager_dir(tmp_path)
    torch.save(collections.UserDict(reference_linear().state_dict()), tmp_path / "weights.pth")
    with pytest.raises(HandlerError, match="Weights only load failed"):
        load(tmp_path, serializedFile="weights.pth", modelFile="model.py")
    service = load(tmp_path, serializedFile="weights.pth", modelFile="model.py", yaml_config={"weights_only": False})
    assert service.predict([json_request(X[0])])[0].status == 200


@pytest.mark.parametrize(
    ("files", "model", "message"),
    [
        ({}, {}, "no serializedFile and no modelFile"),
        ({"model.bin": b"x"}, {"serializedFile": "model.bin"}, r"TorchScript \(.pt\), torch.export"),
        ({}, {"modelFile": "model.py"}, "Missing the model file 'model.py'"),
        (
            {"model.py": LINEAR_SOURCE + "\nclass Extra(torch.nn.Module):\n    pass\n"},
            {"modelFile": "model.py"},
            "found: Extra, Net",
        ),
    ],
)
def test_load_errors(tmp_path: Path, files: dict[str, Any], model: dict[str, str], message: str) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    with pytest.raises(HandlerError, match=message):
        load(tmp_path, **model)


def test_model_file_without_weights_uses_fresh_init(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(LINEAR_SOURCE)
    service = load(tmp_path, modelFile="model.py")
    assert len(json.loads(service.predict([json_request(X[0])])[0].body)) == 2


def test_bad_json_inputs_rejected_per_request_and_model_runs_once(tmp_path: Path) -> None:
    counting = LINEAR_SOURCE.replace(
        "        return self.fc(x)", "        CALLS.append(x.shape[0])\n        return self.fc(x)"
    )
    (tmp_path / "model.py").write_text("CALLS = []\n" + counting)
    torch.save(reference_linear().state_dict(), tmp_path / "weights.pth")
    service = load(tmp_path, serializedFile="weights.pth", modelFile="model.py")
    batch = [
        json_request(X[0], "a"),
        json_request("a string", "b"),
        json_request(X[1], "c"),
        Request("d", {}, [InputParam("body", None, b"")]),
    ]
    out = service.predict(batch)
    assert [r.status for r in out] == [200, 400, 200, 400]
    assert sys.modules["model"].CALLS == [2]
    torch.testing.assert_close(torch.tensor([json.loads(out[i].body) for i in (0, 2)]), expected(X))
    messages = [json.loads(out[i].body) for i in (1, 3)]
    assert messages == [
        {
            "code": 400,
            "type": "BadRequestException",
            "message": "request b: body must be a JSON array of numbers, got a str",
        },
        {
            "code": 400,
            "type": "BadRequestException",
            "message": "request d: body must be a JSON array of numbers, got an empty body",
        },
    ]


def test_all_inputs_bad_skips_the_model(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(
        "CALLS = []\n"
        + LINEAR_SOURCE.replace("        return self.fc(x)", "        CALLS.append(1)\n        return self.fc(x)")
    )
    service = load(tmp_path, modelFile="model.py")
    out = service.predict([json_request({"a": 1}), json_request(None)])
    assert [r.status for r in out] == [400, 400]
    assert sys.modules["model"].CALLS == []


HOOKED_HANDLER = """
from servetune.handlers.base import BaseHandler

class Hooked(BaseHandler):
    def _apply_optimization(self):
        self.optimized_model_type = type(self.model).__name__

    def describe_handle(self):
        return {"optimized": self.optimized_model_type, "labels": self.mapping}
"""


def test_optimization_hook_runs_after_loading_and_describe(tmp_path: Path) -> None:
    eager_dir(tmp_path)
    (tmp_path / "handler.py").write_text(textwrap.dedent(HOOKED_HANDLER))
    (tmp_path / "index_to_name.json").write_text(json.dumps({"0": ["n01", "cat"], "1": "dog"}))
    service = load(tmp_path, handler="handler.py", serializedFile="weights.pth", modelFile="model.py")
    (out,) = service.predict([Request("r", {}, [], Control(describe=True))])
    assert json.loads(out.body) == {"optimized": "Net", "labels": {"0": "cat", "1": "dog"}}


WRAPPED_HANDLER = """
from servetune.handlers.base import BaseHandler

class Hooked(BaseHandler):
    def _apply_optimization(self):
        self.applied = self.model_yaml_config["optimization"]

_service = Hooked()

def handle(data, context):
    if not _service.initialized:
        _service.initialize(context)
    return None if data is None else _service.handle(data, context)
"""


def test_a_function_handler_over_a_base_handler_takes_the_variant(tmp_path: Path) -> None:
    """TorchServe's module pattern: a ``handle`` function over a ``BaseHandler`` instance; its ``initialize`` ran, so
    the variant is applied (here by the hook) and the load goes on."""
    eager_dir(tmp_path)
    (tmp_path / "handler.py").write_text(textwrap.dedent(WRAPPED_HANDLER))
    service = load(
        tmp_path,
        handler="handler.py",
        yaml_config={"optimization": "bf16"},
        serializedFile="weights.pth",
        modelFile="model.py",
    )
    assert sys.modules["handler"]._service.applied == "bf16"
    assert service.predict([json_request(X[0])])[0].status == 200


def test_profile_records_stage_times_and_handler_time(tmp_path: Path) -> None:
    service = load(
        eager_dir(tmp_path),
        serializedFile="weights.pth",
        modelFile="model.py",
        yaml_config={"handler": {"profile": True}},
    )
    service.predict([json_request(X[0])])
    metrics = service.context.metrics
    for name in ("ts_handler_preprocess", "ts_handler_inference", "ts_handler_postprocess", "HandlerTime"):
        assert metrics.get_metric(name, MetricTypes.GAUGE).last is not None


def test_explain_without_support_is_501(tmp_path: Path) -> None:
    service = load(eager_dir(tmp_path), serializedFile="weights.pth", modelFile="model.py")
    (out,) = service.predict(
        [Request("r", {}, [InputParam("body", "application/json", b"[1,2,3,4]")], Control(explain=True))]
    )
    assert out.status == 501


def test_cpu_threads_left_as_the_worker_set_them(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    load(eager_dir(tmp_path), serializedFile="weights.pth", modelFile="model.py")
    assert torch.get_num_threads() == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_id_selects_that_cuda_device(tmp_path: Path) -> None:
    eager_dir(tmp_path)
    manifest = {"model": {"handler": "base_handler", "serializedFile": "weights.pth", "modelFile": "model.py"}}
    service = load_service(
        model_dir=tmp_path, manifest=manifest, model_name="m", gpu_id=0, batch_size=2, model_yaml_config={}
    )
    out = service.predict([json_request(X[0]), json_request(X[1])])
    assert [r.status for r in out] == [200, 200]
    torch.testing.assert_close(torch.tensor([json.loads(r.body) for r in out]), expected(X), rtol=1e-3, atol=1e-3)
    assert service.context.system_properties["gpu_id"] == 0
    assert torch.cuda.memory_allocated(0) > 0  # the weights live on the GPU
