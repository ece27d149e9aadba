"""Which server trials run on (``targets/``): the backend and its address, read from the study or the command line
and checked before any trial; Ray's own knob (the batches a replica holds) searched on Ray and ignored elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from ray_cluster import run_cli_without_ray
from servetune._exceptions import ConfigError
from servetune.tune import load_study, override
from servetune.tune.targets import prepare, target_kind
from tune_studies import CASE_STUDY, native, refused, study_files, write

HAS_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture
def files(tmp_path: Path) -> Path:
    return study_files(tmp_path)


def test_the_backend_is_native_unless_the_study_or_the_command_line_says_ray(files: Path) -> None:
    study = load_study(write(files, native()), devices={"cpu"})
    assert (study.backend, study.backend_address) == ("native", None)
    if not HAS_RAY:
        pytest.skip("Ray is not installed")
    on_ray = load_study(write(files, native(backend="ray", ray_address="10.0.0.5:6379")), devices={"cpu"})
    assert (on_ray.backend, on_ray.backend_address) == ("ray", "10.0.0.5:6379")
    assert on_ray.fingerprint() != study.fingerprint()  # another server measures differently
    # the cluster's address is not part of it: a study resumes on a restarted head
    assert override(on_ray, address="head:6380").fingerprint() == on_ray.fingerprint()
    overridden = override(study, backend="ray", address="auto")
    assert (overridden.backend, overridden.backend_address) == ("ray", "auto")
    assert override(on_ray, backend="native").backend_address is None


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"backend": "k8s"}, r"^backend='k8s': expected native or ray$"),
        ({"backend": 3}, r"^backend=3: expected native or ray$"),
        ({"backend": "ray", "ray_address": "head"}, r"^ray_address='head': expected HOST:PORT"),
        ({"backend": "ray", "ray_address": "head:99999"}, r"^ray_address='head:99999': expected HOST:PORT"),
        ({"backend": "ray", "ray_address": "ray://head:10001"}, r"^ray_address='ray://head:10001': expected"),
        ({"ray_address": "head:6379"}, r"^ray_address='head:6379': only used with backend ray"),
        ({"backend": "ray", "server": {"inference_token_authorization": True}}, r"^server: inference_token_auth"),
    ],
)
def test_invalid_backends_name_the_key_and_value(files: Path, change: dict[str, Any], pattern: str) -> None:
    if change.get("backend") == "ray" and "server" in change and not HAS_RAY:
        pytest.skip("Ray is not installed")
    refused(files, native(**change), pattern)


def test_command_line_backend_overrides_are_validated(files: Path) -> None:
    study = load_study(write(files, native()), devices={"cpu"})
    with pytest.raises(ConfigError, match=r"^ray_address='head:6379': only used with backend ray"):
        override(study, address="head:6379")
    text = CASE_STUDY.format(archive=files / "model.mar", input=files / "input.png")
    case_study = load_study(write(files, text), devices={"cpu"})
    with pytest.raises(ConfigError, match=r"^backend='ray': TorchServe's auto-benchmark form runs on the native"):
        override(case_study, backend="ray")


def test_without_ray_a_ray_study_says_how_to_install_it(files: Path) -> None:
    path = write(files, native())
    done = run_cli_without_ray(["tune", str(path), "--backend", "ray", "--out", str(files / "out")])
    assert done.returncode == 2, done.stderr
    assert "pip install 'servetune[ray]'" in done.stderr
    assert not (files / "out").exists()  # refused before any trial


def test_on_ray_the_batches_a_replica_holds_are_searched_unless_the_study_sets_them(files: Path) -> None:
    if not HAS_RAY:
        pytest.skip("Ray is not installed")
    from servetune.tune.archives import trial_model_config

    study = load_study(write(files, native(backend="ray")), devices={"cpu"})
    assert [f.label for f in study.families] == ["eager/cpu"]  # as written; the tuner expands it
    searched = prepare(study)
    assert [(f.label, f.options) for f in searched.families] == [
        ("eager/cpu/q1", {"ongoing_batches": 1}),
        ("eager/cpu/q2", {"ongoing_batches": 2}),
    ]
    assert searched.size == 2 * study.size and prepare(searched) == searched
    assert searched.baseline.family == "eager/cpu/q2"  # the default deployment: the server's default, 2
    ray = target_kind("ray")
    first = searched.families[0]
    assert trial_model_config({}, first, ray.model_config(first))["rayOngoingBatches"] == 1
    assert ray.describe(searched.families[1]) == ", replicas hold 2 batches"
    assert searched.fingerprint() != study.fingerprint()
    on_native = override(study, backend="native")  # the knob does not exist there
    assert prepare(on_native) is on_native

    space = {**native()["space"], "ray_ongoing_batches": 4}
    listed = prepare(load_study(write(files, native(backend="ray", space=space)), devices={"cpu"}))
    assert [f.label for f in listed.families] == ["eager/cpu/q4"]
    assert listed.baseline.family == "eager/cpu" and not listed.baseline_family.options
    pinned = load_study(write(files, native(backend="ray", model_config={"rayOngoingBatches": 1})), devices={"cpu"})
    assert prepare(pinned) == pinned

    ignored = prepare(load_study(write(files, native(space={**native()["space"], "ray_ongoing_batches": [1, 2]})),
                                 devices={"cpu"}))  # fmt: skip
    assert [f.label for f in ignored.families] == ["eager/cpu"]
    assert any("space.ray_ongoing_batches ignored" in note for note in ignored.notes)


@pytest.mark.parametrize(
    ("space", "model_config", "pattern"),
    [
        ({"ray_ongoing_batches": [0, 1]}, {}, r"^space.ray_ongoing_batches\[0\]=0: expected"),
        ({"ray_ongoing_batches": [1, 65]}, {}, r"^space.ray_ongoing_batches=\[1, 65\]: expected whole numbers 1..64$"),
        ({"ray_ongoing_batches": [1]}, {"rayOngoingBatches": 2}, r"^space.ray_ongoing_batches and model_config.ray"),
    ],
)
def test_invalid_ray_queue_depths_are_refused(
    files: Path, space: dict[str, Any], model_config: dict[str, Any], pattern: str
) -> None:
    changes: dict[str, Any] = {"space": {**native()["space"], **space}}
    if model_config:
        changes["model_config"] = model_config
    refused(files, native(**changes), pattern)
