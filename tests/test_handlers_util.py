"""Label mapping, class discovery and the handler exceptions."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from servetune.handlers.util import (
    BadInputError,
    PredictionException,
    get_yaml_config,
    list_classes_from_module,
    load_label_mapping,
    map_class_to_label,
    request_input,
)


def test_load_label_mapping_formats(tmp_path: Path) -> None:
    path = tmp_path / "index_to_name.json"
    assert load_label_mapping(path) is None
    path.write_text(json.dumps({"0": ["n01440764", "tench"], "1": "goldfish"}))
    assert load_label_mapping(path) == {"0": "tench", "1": "goldfish"}
    path.write_text(json.dumps({"object_type_names": ["cat", "dog"]}))
    assert load_label_mapping(path) == {"0": "cat", "1": "dog"}
    path.write_text(json.dumps(["cat"]))
    with pytest.raises(ValueError, match='"class": "label"'):
        load_label_mapping(path)
    path.write_text(json.dumps({"0": 5}))
    with pytest.raises(ValueError, match="must be a str"):
        load_label_mapping(path)


def test_map_class_to_label() -> None:
    assert map_class_to_label([[0.1, 0.9]]) == [{"0": 0.1, "1": 0.9}]
    assert map_class_to_label([[0.9, 0.1]], {"3": "cat"}, [[3, 4]]) == [{"cat": 0.9, "4": 0.1}]
    with pytest.raises(TypeError):
        map_class_to_label((0.1,))  # type: ignore[arg-type]


def test_list_classes_from_module_only_own_classes() -> None:
    module = types.ModuleType("fake")
    exec("from servetune.handlers.util import PredictionException\nclass A: pass\nclass B(A): pass\n", module.__dict__)
    assert list_classes_from_module(module) == [module.A, module.B]
    assert list_classes_from_module(module, module.B) == [module.B]


def test_exceptions() -> None:
    exc = PredictionException("boom", 418)
    assert (exc.message, exc.error_code, str(exc), exc.error_type) == (
        "boom",
        418,
        "boom : 418",
        "InternalServerException",
    )
    assert PredictionException("x").error_code == 500
    bad = BadInputError("empty")
    assert isinstance(bad, PredictionException) and bad.error_code == 400 and bad.error_type == "BadRequestException"


def test_request_input_and_yaml(tmp_path: Path) -> None:
    assert request_input({"data": b"d", "body": b"b"}) == b"d"
    assert request_input({"data": b"", "body": b"b"}) == b"b"
    assert request_input({"data": b""}) == b""
    assert request_input({"other": 1}) is None
    (tmp_path / "c.yaml").write_text("handler:\n  profile: true\n")
    assert get_yaml_config(tmp_path / "c.yaml") == {"handler": {"profile": True}}
    (tmp_path / "e.yaml").write_text("")
    assert get_yaml_config(tmp_path / "e.yaml") == {}
