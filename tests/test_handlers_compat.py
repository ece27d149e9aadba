"""The ``ts`` alias: TorchServe handlers import ``ts.*`` and get servetune's modules."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import servetune
from servetune.handlers import InputParam, Request, install_ts_alias, load_service, uninstall_ts_alias
from servetune.handlers.compat import ALIASES

TORCHSERVE_HANDLER = """
import json

import torch
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException


class SumHandler(BaseHandler):
    \"\"\"Written for TorchServe: sums a JSON list, refuses negative totals with a custom status.\"\"\"

    def initialize(self, context):
        self.offset = float(context.model_yaml_config.get("offset", 0))
        self.initialized = True

    def preprocess(self, data):
        return [sum(row.get("data") or row.get("body")) for row in data]

    def inference(self, data):
        return torch.tensor(data) + self.offset

    def postprocess(self, data):
        if bool((data < 0).any()):
            raise PredictionException("negative total", 422)
        return [{"total": float(v)} for v in data]
"""


@pytest.fixture
def fresh_alias() -> Iterator[None]:
    uninstall_ts_alias()
    yield
    uninstall_ts_alias()


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # load_service puts the model dir on sys.path and installs the ts alias: undo both for other tests
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    uninstall_ts_alias()


def test_torchserve_handler_runs_unchanged(tmp_path: Path) -> None:
    (tmp_path / "sum_handler.py").write_text(TORCHSERVE_HANDLER)
    manifest = {"model": {"modelName": "sum", "modelVersion": "1", "handler": "sum_handler.py"}}
    service = load_service(
        model_dir=tmp_path,
        manifest=manifest,
        model_name="sum",
        gpu_id=None,
        batch_size=4,
        model_yaml_config={"offset": 0.5},
    )

    def body(values: list[float]) -> Request:
        return Request("r", {}, [InputParam("data", "application/json", json.dumps(values).encode())])

    out = service.predict([body([1, 2]), body([3])])
    assert [json.loads(r.body) for r in out] == [{"total": 3.5}, {"total": 3.5}]
    good, bad = service.predict([body([1]), body([-5])])
    assert (good.status, bad.status) == (200, 422)
    assert json.loads(bad.body)["message"] == "negative total"

    from servetune.handlers.base import BaseHandler

    handler_module = sys.modules["sum_handler"]
    assert issubclass(handler_module.SumHandler, BaseHandler)


def test_aliases_are_the_servetune_modules(fresh_alias: None) -> None:
    install_ts_alias()
    for alias, target in ALIASES.items():
        module = importlib.import_module(alias)
        if target is None:
            assert module.__version__ == servetune.__version__
        else:
            assert module is importlib.import_module(target)
            assert module.__spec__ is not None and module.__spec__.name == target  # not relabelled by the alias
    from ts.context import Context
    from ts.handler_utils.timer import timed
    from ts.metrics.dimension import Dimension
    from ts.torch_handler.image_classifier import ImageClassifier
    from ts.torch_handler.vision_handler import VisionHandler

    from servetune.handlers import context, metrics, vision

    assert Context is context.Context and timed is metrics.timed and Dimension is metrics.Dimension
    assert issubclass(ImageClassifier, vision.VisionHandler) and VisionHandler is vision.VisionHandler


def test_unprovided_ts_module_is_not_found(fresh_alias: None) -> None:
    # without TorchServe on the path (it may be installed here): hide every folder that holds a ts package
    sys.path[:] = [p for p in sys.path if not (Path(p or ".") / "ts" / "__init__.py").is_file()]
    install_ts_alias()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ts.torch_handler.request_envelope")


def test_real_torchserve_installed_ours_wins_and_the_rest_falls_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_alias: None
) -> None:
    real = tmp_path / "site" / "ts"
    (real / "torch_handler" / "request_envelope").mkdir(parents=True)
    (real / "__init__.py").write_text("raise RuntimeError('the real ts package was imported')\n")
    (real / "context.py").write_text("raise RuntimeError('the real ts.context was imported')\n")
    (real / "torch_handler" / "__init__.py").write_text("")
    (real / "torch_handler" / "request_envelope" / "__init__.py").write_text("")
    (real / "torch_handler" / "request_envelope" / "json.py").write_text(
        textwrap.dedent("""
            from ts.context import Context
            WRAPS = Context
        """)
    )
    sys.path.insert(0, str(tmp_path / "site"))
    stale = types.ModuleType("ts")
    monkeypatch.setitem(sys.modules, "ts", stale)  # a real ts imported before the alias

    install_ts_alias()
    assert sys.modules.get("ts") is not stale
    envelope = importlib.import_module("ts.torch_handler.request_envelope.json")
    from servetune.handlers.context import Context

    assert envelope.WRAPS is Context
    assert Path(envelope.__file__).is_relative_to(real)


def test_install_is_idempotent_and_uninstall_restores(fresh_alias: None) -> None:
    install_ts_alias()
    install_ts_alias()
    finders = [f for f in sys.meta_path if type(f).__name__ == "_TsAliasFinder"]
    assert len(finders) == 1
    import ts.utils.util

    assert ts.utils.util.PredictionException("x", 400).error_code == 400
    uninstall_ts_alias()
    assert "ts" not in sys.modules and "ts.utils.util" not in sys.modules
    assert not any(type(f).__name__ == "_TsAliasFinder" for f in sys.meta_path)


def test_torch_stays_importable_alongside() -> None:
    # the alias must not disturb unrelated imports
    install_ts_alias()
    assert importlib.import_module("torch.nn.functional") is torch.nn.functional
