from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servetune._exceptions import ArchiveError
from servetune.archive import Manifest, ManifestModel, validate_model_name

# What torch-model-archiver 0.12 writes for --serialized-file/--model-file/-r/-c.
TMA_MANIFEST: dict[str, Any] = {
    "createdOn": "03/02/2025 14:05:09",
    "runtime": "python",
    "model": {
        "modelName": "resnet-18",
        "serializedFile": "resnet18.pt",
        "handler": "image_classifier",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "requirementsFile": "requirements.txt",
        "configFile": "model-config.yaml",
    },
    "archiverVersion": "0.12.0",
}


def test_fields_of_a_torch_model_archiver_manifest() -> None:
    m = Manifest.from_dict(TMA_MANIFEST)
    assert (m.created_on, m.runtime, m.archiver_version) == ("03/02/2025 14:05:09", "python", "0.12.0")
    assert m.model == ManifestModel(
        model_name="resnet-18",
        serialized_file="resnet18.pt",
        handler="image_classifier",
        model_file="model.py",
        model_version="1.0",
        requirements_file="requirements.txt",
        config_file="model-config.yaml",
    )
    assert m.to_dict() == TMA_MANIFEST
    assert list(m.to_dict()) == ["createdOn", "runtime", "model", "archiverVersion"]
    assert list(m.to_dict()["model"]) == list(TMA_MANIFEST["model"])
    assert json.loads(m.to_json()) == TMA_MANIFEST
    assert m.to_json() == json.dumps(TMA_MANIFEST, indent=2)


def test_java_only_and_unknown_keys_are_kept() -> None:
    data = {
        "runtime": "python3",
        "description": "top",
        "specificationVersion": "1.0",
        "model": {
            "modelName": "m",
            "handler": "h.py",
            "envelope": "json",
            "description": "d",
            "version": "2",
            "x": [1],
        },
    }
    m = Manifest.from_dict(data)
    assert (m.description, m.model.envelope, m.model.description, m.model.version) == ("top", "json", "d", "2")
    assert m.extra == {"specificationVersion": "1.0"} and m.model.extra == {"x": [1]}
    assert m.to_dict() == data
    assert m.raw == data


def test_raw_is_exactly_what_was_read_and_is_a_copy() -> None:
    data = {"runtime": "python", "model": {"modelName": "m", "modelVersion": 2.5}, "custom": {"a": 1}}
    m = Manifest.from_dict(data)
    assert m.model.model_version == "2.5"  # Gson reads a JSON number into a String field as its text
    assert m.raw == data and m.raw["model"]["modelVersion"] == 2.5
    m.raw["custom"]["a"] = 2
    assert m.raw["custom"] == {"a": 1}
    data["custom"]["a"] = 3
    assert m.raw["custom"] == {"a": 1}


def test_replace_makes_raw_follow_the_new_values() -> None:
    m = Manifest.from_dict(TMA_MANIFEST)
    changed = dataclasses.replace(m, model=dataclasses.replace(m.model, model_name="other"))
    assert changed.raw["model"]["modelName"] == "other"
    assert m.raw["model"]["modelName"] == "resnet-18"


def test_missing_manifest_is_the_empty_manifest() -> None:
    m = Manifest.from_dict({})
    assert m == Manifest()
    assert m.runtime == "python" and m.model.model_name is None and m.model.handler is None
    assert m.raw == {}


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"runtime": "java"}, "runtime"),
        ({"model": "x"}, "model"),
        ({"model": {"handler": {"a": 1}}}, "model.handler"),
        ({"model": {"modelName": True}}, "model.modelName"),
        ({"createdOn": ["x"]}, "createdOn"),
    ],
)
def test_invalid_manifests_name_the_key(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ArchiveError, match=fragment.replace(".", r"\.")):
        Manifest.from_dict(data)


def test_from_json_names_the_file() -> None:
    with pytest.raises(ArchiveError, match="x.mar: MAR-INF"):
        Manifest.from_json("{not json", where="x.mar: MAR-INF/MANIFEST.json")
    with pytest.raises(ArchiveError, match="must be a JSON object"):
        Manifest.from_json("[1, 2]")


def test_create_stamps_the_torch_model_archiver_date_format() -> None:
    m = Manifest.create(ManifestModel(model_name="m"), created_on=datetime(2024, 7, 5, 9, 8, 7))
    assert m.created_on == "05/07/2024 09:08:07"
    assert datetime.strptime(Manifest.create(ManifestModel()).created_on or "", "%d/%m/%Y %H:%M:%S")


@pytest.mark.parametrize("name", ["resnet-18", "a", "M.v2_final-1", "7zip"])
def test_valid_model_names(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "_x", "a b", "a/b", "../x", "x\n", "naïve", "a:b"])
def test_invalid_model_names_name_the_value(name: str) -> None:
    with pytest.raises(ArchiveError) as info:
        validate_model_name(name)
    assert repr(name) in str(info.value)


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_string_keys = ["modelName", "serializedFile", "handler", "modelFile", "modelVersion", "requirementsFile",
                "configFile", "description", "version", "envelope"]  # fmt: skip
_model = st.fixed_dictionaries(
    {}, optional={**{k: _text for k in _string_keys}, "extensions": _json.filter(lambda v: v is not None)}
)
_TOP = {"createdOn", "runtime", "model", "archiverVersion", "description"}


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {"runtime": draw(st.sampled_from(["python", "python3", "LSP"]))}
    for key in ("createdOn", "archiverVersion", "description"):
        if draw(st.booleans()):
            data[key] = draw(_text)
    model = draw(_model)
    unknown_model_key = _text.filter(lambda k: k not in _string_keys and k != "extensions")
    model.update(draw(st.dictionaries(unknown_model_key, _json, max_size=2)))
    data["model"] = model
    data.update(draw(st.dictionaries(_text.filter(lambda k: k not in _TOP), _json, max_size=3)))
    return data


@settings(max_examples=200, deadline=None)
@given(manifests())
def test_random_manifests_round_trip(data: dict[str, Any]) -> None:
    m = Manifest.from_dict(data)
    assert m.to_dict() == data
    assert m.raw == data
    again = Manifest.from_json(m.to_json())
    assert again == m
    assert again.to_dict() == data
