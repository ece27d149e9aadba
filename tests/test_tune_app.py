"""App studies (several models, one server, the app's load): how they are read, and how invalid ones are refused
before any trial, naming the key and the value. No server here: see test_tune_app_e2e.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from servetune.tune import AppConfig, Config, load_study
from servetune.tune.space import Space
from tune_studies import refused, study_files, write


@pytest.fixture
def files(tmp_path: Path) -> Path:
    study_files(tmp_path)
    (tmp_path / "hooks.py").write_text("def pose_request(answer, source):\n    return source\n")
    return tmp_path


def app(**changes: Any) -> dict[str, Any]:
    study: dict[str, Any] = {
        "app": "drawings",
        "models": {
            "detector": {"archive": "model.mar", "input": "input.png", "space": {"workers": [1, 2],
                                                                                  "batch_size": [1, 2]}},
            "pose": {"archive": "model.mar", "space": {"workers": [1, 2, 3], "threads": [1, 2]},
                     "sla": {"p99_ms": 300}},
        },
        "pipeline": ["detector", {"model": "pose", "request": "hooks.py:pose_request", "form_field": "data"}],
        "sla": {"p99_ms": 1000},
        "load": {"duration": "5s"},
    }  # fmt: skip
    study.update(changes)
    return study


def test_an_app_study_is_the_product_of_its_models_spaces(files: Path) -> None:
    study = load_study(write(files, app()), devices={"cpu"})
    assert study.is_app and study.model == "drawings" and study.model_names == ("detector", "pose")
    assert [f.label for f in study.families] == ["detector/eager/cpu", "pose/eager/cpu"]
    assert [f.model for f in study.families] == ["detector", "pose"]
    assert study.size == (2 * 2) * (3 * 2) == len(Space(study).configs())
    assert study.baseline == AppConfig((Config("detector/eager/cpu", 1, 1, 100), Config("pose/eager/cpu", 1, 1, 100)))
    assert study.model_spec("pose").sla.p99_ms == 300 and study.model_spec("detector").sla.empty
    assert [(s.model, s.request, s.form_field) for s in study.pipeline] == [
        ("detector", "input", None),
        ("pose", "hooks.py:pose_request", "data"),
    ]
    # the hook is part of what a measurement depends on
    before = study.fingerprint()
    (files / "hooks.py").write_text("def pose_request(answer, source):\n    return answer\n")
    assert load_study(write(files, app()), devices={"cpu"}).fingerprint() != before


def test_references_name_configs_of_the_whole_app(files: Path) -> None:
    data = app(references={"detector tuned alone": {"detector": {"workers": 2, "batch_size": 2}}})
    study = load_study(write(files, data), devices={"cpu"})
    [(label, config)] = study.references
    assert label == "detector tuned alone"
    assert config == AppConfig((Config("detector/eager/cpu", 2, 2, 100), Config("pose/eager/cpu", 1, 1, 100)))
    assert study.fingerprint() == load_study(write(files, app()), devices={"cpu"}).fingerprint()  # adds, changes none


def test_a_share_move_gives_a_worker_from_one_model_to_another(files: Path) -> None:
    study = load_study(write(files, app()), devices={"cpu"})
    space = Space(study)
    point = AppConfig((Config("detector/eager/cpu", 1, 1, 100), Config("pose/eager/cpu", 2, 1, 100, threads=1)))
    shares = space.shares(point)
    assert shares == [AppConfig((Config("detector/eager/cpu", 2, 1, 100),
                                 Config("pose/eager/cpu", 1, 1, 100, threads=1)))]  # fmt: skip
    assert shares[0] in space.neighbours(point) and point in space


def test_a_mix_loads_each_model_at_its_share(files: Path) -> None:
    data = app(mix={"detector": 1, "pose": 3}, load={"mode": "capacity"})
    data.pop("pipeline")
    study = load_study(write(files, data), devices={"cpu"})
    assert study.mix == (("detector", 1.0), ("pose", 3.0)) and not study.pipeline


def change(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``data`` with the value at the dotted ``path`` replaced (None: removed)."""
    out = copy.deepcopy(data)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if value is None:
        node.pop(last)
    else:
        node[last] = value
    return out


@pytest.mark.parametrize(
    ("path", "value", "pattern"),
    [
        ("models", {"pose": {"archive": "model.mar"}}, r"^models=\['pose'\]: expected two or more models"),
        ("models.pose.cores", 2, r"^models\.pose\.cores: unknown key; expected one of archive"),
        ("models.pose.space.workers", [0], r"^models\.pose\.space\.workers\[0\]=0: expected a whole number >= 1"),
        ("models.pose.sla", {"p99_ms": -1}, r"^models\.pose\.sla\.p99_ms=-1: expected a number > 0"),
        ("models.pose.archive", "none.mar", r"^models\.pose\.archive='none.mar': no such file"),
        ("models.detector.input", None, r"^models\.detector\.input: missing; the pipeline's first stage sends it"),
        ("pipeline", ["detector", "posture"], r"^pipeline\[1\]\.model='posture': expected one of the models"),
        ("pipeline", ["detector"], r"^pipeline=\['detector'\]: expected a list of two or more stages"),
        ("pipeline", ["detector", {"model": "pose", "request": "h.py:f"}], r"^pipeline\[1\]\.request='h.py:f': no"),
        ("pipeline", ["detector", {"model": "pose", "request": "hooks.py:nope"}], r"hooks.py has no function 'nope'"),
        ("pipeline", ["detector", "pose", "detector"], r"^pipeline\[2\]\.model='detector': expected each model once"),
        ("mix", {"detector": 1, "pose": 1}, r"^pipeline, mix: give one"),
        ("objective", {"cost": {"cpu": 1}}, r"^objective=\{'cost': \{'cpu': 1\}\}: expected throughput"),
        ("ray_address", "head:6379", r"^ray_address='head:6379': only used with backend ray"),
        ("references", {"x": {"posture": {}}}, r"^references\.x\.posture=\{\}: expected a config of one of the"),
        ("references", {"x": {"pose": {"workers": 0}}}, r"^references\.x\.pose\.workers=0: expected a whole"),
        ("references", {"x": {"pose": {"device": "cuda"}}}, r"^references\.x\.pose: eager/cuda is not one of"),
    ],
)
def test_invalid_app_studies_name_the_key_and_value(files: Path, path: str, value: Any, pattern: str) -> None:
    refused(files, change(app(), path, value), pattern)


def test_a_model_outside_the_pipeline_and_a_mix_without_capacity_are_refused(files: Path) -> None:
    data = app()
    data["models"]["extra"] = {"archive": "model.mar"}
    refused(files, data, r"^models\.extra: not called by the pipeline; expected every model in it")
    mixed = change(app(mix={"detector": 1, "pose": 3}), "pipeline", None)
    refused(files, mixed, r"^mix: needs load mode capacity")
    partial = change(app(mix={"detector": 1}, load={"mode": "capacity"}), "pipeline", None)
    refused(files, partial, r"^mix: no share for pose")
