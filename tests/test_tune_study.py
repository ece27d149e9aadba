"""Study files, both forms: what is accepted, what is refused (naming the key and value), what is skipped."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from servetune._exceptions import ConfigError
from servetune.tune import load_study, override
from servetune.tune._values import duration
from servetune.tune.study import Study
from tune_studies import CASE_STUDY, native, refused, study_files, write


@pytest.fixture
def files(tmp_path: Path) -> Path:
    return study_files(tmp_path)


def test_native_study_is_read_with_defaults(files: Path) -> None:
    study = load_study(write(files, native()), devices={"cpu"})
    assert study.form == "servetune"
    assert study.model == "model"
    assert [f.label for f in study.families] == ["eager/cpu"]
    family = study.families[0]
    assert (family.workers, family.batch_sizes, family.batch_delays_ms) == ((1, 2), (1, 4), (10,))
    assert family.archive == (files / "model.mar").resolve() and family.input == (files / "input.png").resolve()
    assert family.load.mode == "concurrency" and family.load.concurrency is None
    assert family.load.clients(2, 4) == 8  # batch size x workers, as the case study advises
    assert study.sla.p99_ms == 100 and study.objective.kind == "throughput"
    assert study.strategy.name == "adaptive" and study.size == 4
    assert study.baseline.workers == 1 and study.baseline.batch_size == 1


def test_native_study_full_form(files: Path) -> None:
    data = native(
        model="detector",
        sla={"p95_ms": 80, "mean_ms": 40, "max_error_rate": 0.01},
        objective={"cost": {"cpu": 0.5}},
        load={"mode": "capacity", "duration": "5s", "warmup": "1s", "arrival": "poisson", "steps": 3},
        strategy={"name": "grid", "remeasure": 1},
        budget={"time": "1h30m", "trials": 50},
        server={"threads_per_worker": 1},
    )
    data["space"]["optimizations"] = ["eager", "bf16+channels_last"]
    study = load_study(write(files, data), devices={"cpu"})
    assert study.model == "detector"
    assert [f.optimization for f in study.families] == ["eager", "channels_last+bf16"]  # canonical order
    assert study.sla.limits() == [("p95_ms", 80.0), ("mean_ms", 40.0)] and study.sla.max_error_rate == 0.01
    assert study.objective.value(10.0, "cpu") == pytest.approx(10 * 3600 / 0.5)
    load = study.families[0].load
    assert (load.mode, load.duration_s, load.warmup_s, load.arrival, load.steps) == ("capacity", 5, 1, "poisson", 3)
    assert study.strategy.name == "grid" and study.strategy.remeasure == 1
    assert study.budget.seconds == 5400 and study.budget.trials == 50
    assert study.server == {"threads_per_worker": "1"}


def test_cuda_is_skipped_with_a_note_when_the_host_has_none(files: Path) -> None:
    data = native()
    data["space"]["devices"] = ["cpu", "cuda"]
    study = load_study(write(files, data), devices={"cpu"})
    assert [f.device for f in study.families] == ["cpu"]
    assert any("cuda" in note and "skipped" in note for note in study.notes)
    data["space"]["devices"] = ["cuda"]
    refused(files, data, r"space\.devices=\['cuda'\]: none is available")


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"slo": {"p99_ms": 1}}, r"^slo: unknown key; expected one of model, archive"),
        ({"space": {"workers": [1], "cores": [2]}}, r"^space\.cores: unknown key"),
        ({"space": {"threads": ["auto", -1]}}, r"^space\.threads\[1\]=-1: expected a whole number >= 0"),
        ({"space": {"pinning": [True, "maybe"]}}, r"^space\.pinning\[1\]='maybe': expected true or false"),
        (
            {"space": {"threads": [1, 2]}, "model_config": {"numThreads": 1}},
            r"^space\.threads and model_config\.numThreads: set one",
        ),
        ({"space": {"workers": [1, 0]}}, r"^space\.workers\[1\]=0: expected a whole number >= 1"),
        ({"space": {"batch_size": "8"}}, r"^space\.batch_size\[0\]='8': expected a whole number"),
        ({"space": {"optimizations": ["eager", "turbo"]}}, r"^space\.optimizations\[1\]='turbo': .*unknown"),
        ({"space": {"devices": ["tpu"]}}, r"^space\.devices\[0\]='tpu': expected one of cpu, cuda"),
        ({"sla": {"p99": 100}}, r"^sla\.p99: unknown key"),
        ({"sla": {"p99_ms": -5}}, r"^sla\.p99_ms=-5: expected a number > 0"),
        ({"objective": "latency"}, r"^objective='latency': expected throughput"),
        ({"objective": {"cost": {"gpu": 1}}}, r"^objective\.cost\.gpu: unknown device"),
        ({"load": "open"}, r"^load='open': expected a mapping"),
        ({"load": {"mode": "capacity", "concurrency": 4}}, r"^load\.concurrency: only for mode concurrency"),
        ({"load": {"duration": "soon"}}, r"^load\.duration='soon': expected a duration"),
        ({"load": {"mode": "capacity"}, "sla": None}, r"load=capacity needs a latency SLA"),
        ({"strategy": "random"}, r"^strategy='random': expected adaptive or grid"),
        ({"budget": "forever"}, r"^budget='forever': expected a duration"),
        ({"server": {"model_store": "/x"}}, r"^server\.model_store: set by the tuner itself"),
        ({"server": {"job_queue_size": "many"}}, r"job_queue_size='many'"),
        ({"archive": "missing.mar"}, r"^archive='missing.mar': no such file"),
        ({"archive": "https://example.com/m.mar"}, r"^archive='https://example.com/m.mar': expected a local path"),
        ({"model": "bad name"}, r"^model='bad name': invalid model name"),
        ({"sla": {"p99_ms": "fast"}}, r"^sla\.p99_ms='fast': expected a number"),
        ({"sla": {"p99_ms": "0.5x"}}, r"^sla\.p99_ms='0.5x': expected a multiple > 1"),
        ({"strategy": {"finalists": 1}}, r"^strategy\.finalists=1: expected 0 \(none\) or 2 and more"),
        ({"strategy": {"rounds": 1}}, r"^strategy\.rounds=1: expected a whole number >= 2"),
        ({"contention": {"max_other_cores": 0}}, r"^contention\.max_other_cores=0: expected a number > 0"),
        ({"contention": {"retry": 1}}, r"^contention\.retry: unknown key"),
        ({"load": {"trace": "missing.csv"}}, r"^load\.trace='missing.csv': no such file"),
        ({"load": {"time_scale": 0.1}}, r"^load\.time_scale: only with a trace"),
        ({"load": {"trace": "input.png", "concurrency": 2}}, r"^load\.concurrency: not with a trace"),
        ({"load": {"trace": "input.png"}, "sla": None}, r"load=trace needs a latency SLA"),
    ],
)
def test_invalid_native_studies_name_the_key_and_value(files: Path, change: dict[str, Any], pattern: str) -> None:
    data = native()
    for key, value in change.items():
        if value is None:
            data.pop(key)
        elif key == "space":
            data["space"] = value
        else:
            data[key] = value
    refused(files, data, pattern)


def test_case_study_yaml_is_accepted_unchanged(files: Path) -> None:
    text = CASE_STUDY.format(archive=files / "model.mar", input=files / "input.png")
    study = load_study(write(files, text), devices={"cpu"})
    assert study.form == "torchserve" and study.model == "drawn_humanoid_detector"
    assert [f.label for f in study.families] == ["eager_mode/cpu"]
    assert any("gpus" in note and "skipped" in note for note in study.notes)
    family = study.families[0]
    assert (family.workers, family.batch_sizes, family.batch_delays_ms) == ((1, 4), (1, 2, 4, 8), (100,))
    load = family.load
    assert (load.mode, load.concurrency, load.requests, load.duration_s) == ("concurrency", 10, 10000, None)
    assert load.warmup_requests == 1000  # TorchServe warms up with a tenth of the requests
    assert load.engine == "ab"  # Apache Bench, as TorchServe runs it (ab is installed here)
    assert study.sla.empty  # the form has none: --sla-p99 adds it
    with_sla = override(study, sla_p99_ms=100)
    assert with_sla.sla.p99_ms == 100 and with_sla.fingerprint() != study.fingerprint()


def test_case_study_yaml_on_a_gpu_host_keeps_both_processors(files: Path) -> None:
    text = CASE_STUDY.format(archive=files / "model.mar", input=files / "input.png")
    study = load_study(write(files, text), devices={"cpu", "cuda"})
    assert [(f.label, f.device) for f in study.families] == [("eager_mode/cpu", "cpu"), ("eager_mode/cuda", "cuda")]
    assert not study.notes


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("        retry_attempts: 5", r"eager_mode\.retry_attempts: not supported .*workflows"),
        ("        image: pytorch/torchserve", r"eager_mode\.image: not supported"),
        ("        batch_sizes: [1]", r"eager_mode\.batch_sizes: unknown key; expected one of benchmark_engine"),
        ("        dockerhub_image: x", r"eager_mode\.dockerhub_image: unknown key"),
    ],
)
def test_torchserve_yaml_rejects_keys_it_cannot_honour(files: Path, line: str, pattern: str) -> None:
    text = CASE_STUDY.format(archive=files / "model.mar", input=files / "input.png") + line + "\n"
    refused(files, text, pattern)


@pytest.mark.parametrize(
    ("old", "new", "pattern"),
    [
        ("backend_profiling: False", "backend_profiling: True", r"backend_profiling=True: not supported"),
        ('exec_env: "local"', 'exec_env: "docker"', r"exec_env='docker': expected 'local'"),
        ('benchmark_engine: "ab"', 'benchmark_engine: "locust"', r"benchmark_engine='locust'"),
        ('- "cpu"', '- "neuronx"', r"processors\[0\]='neuronx': AWS Inferentia is not supported"),
        ("concurrency: 10", "concurrency: ten", r"eager_mode\.concurrency='ten'"),
    ],
)
def test_torchserve_yaml_values_are_checked(files: Path, old: str, new: str, pattern: str) -> None:
    text = CASE_STUDY.format(archive=files / "model.mar", input=files / "input.png").replace(old, new)
    refused(files, text, pattern)


def test_torchserve_yaml_modes_and_models_become_families(files: Path) -> None:
    data = {
        "vgg16": {
            "eager_mode": {"url": "model.mar", "workers": [4], "batch_size": [1, 2], "processors": ["cpu"]},
            "scripted_mode": {"url": "model.mar", "workers": [2], "batch_size": [8], "handler_profiling": True},
        }
    }
    study = load_study(write(files, data), devices={"cpu"})
    assert [f.label for f in study.families] == ["eager_mode/cpu", "scripted_mode/cpu"]
    assert study.families[1].model_config == {"handler": {"profile": True}}
    assert study.families[0].load.concurrency == 10 and study.families[0].load.requests == 100  # benchmark-ab defaults
    assert study.families[0].batch_delays_ms == (200,)
    assert study.size == 2 + 1


def test_a_model_entry_that_is_not_a_mapping_of_modes_is_refused(files: Path) -> None:
    refused(files, {"mnist": {"url": "model.mar"}}, r"mnist\.url=.*expected a mapping")
    refused(files, {"mnist": ["eager_mode"]}, r"^mnist: expected a mapping of benchmark modes")


def test_fingerprint_follows_what_changes_measurements(files: Path) -> None:
    base = load_study(write(files, native()), devices={"cpu"}).fingerprint()
    assert base == load_study(write(files, native(budget="5m")), devices={"cpu"}).fingerprint()
    other = native()
    other["space"]["workers"] = [1, 2, 4]
    assert base != load_study(write(files, other), devices={"cpu"}).fingerprint()
    (files / "model.mar").write_bytes(b"PK\x05\x06" + b"\1" * 18)  # the archive's content changed
    assert base != load_study(write(files, native()), devices={"cpu"}).fingerprint()


def test_overrides_are_validated(files: Path) -> None:
    study: Study = load_study(write(files, native()), devices={"cpu"})
    assert override(study, budget_s=60, strategy="grid").strategy.name == "grid"
    with pytest.raises(ConfigError, match=re.escape("strategy='best': expected one of adaptive, grid")):
        override(study, strategy="best")


def test_trust_keys_are_read(files: Path) -> None:
    (files / "day.csv").write_text("t_ms\n0\n10\n")
    data = native(
        sla={"p99_ms": "3x", "mean_ms": 40},
        strategy={"name": "grid", "finalists": 3, "rounds": 4},
        contention={"max_other_cores": 0.5, "retries": 0},
        load={"trace": "day.csv", "trace_format": "csv", "trace_options": {"repeat": 2}, "time_scale": 0.5,
              "capacity_fraction": 0.8, "duration": "5s"},
    )  # fmt: skip
    study = load_study(write(files, data), devices={"cpu"})
    assert study.sla_scale == (("p99_ms", 3.0),) and study.sla.p99_ms is None and study.sla.mean_ms == 40
    assert (study.strategy.finalists, study.strategy.rounds) == (3, 4)
    assert (study.contention.max_other_cores, study.contention.retries) == (0.5, 0)
    load = study.families[0].load
    assert load.mode == "trace" and load.trace == (files / "day.csv").resolve() and load.trace_format == "csv"
    assert load.trace_options == (("repeat", "2"),) and load.time_scale == 0.5 and load.capacity_fraction == 0.8
    assert not load.early_stop  # a trace plays whole
    # --sla-p99 as a multiple replaces the file's p99 (a limit in ms, or a multiple); ms replaces a multiple
    fixed = override(study, sla_p99_ms=250.0)
    assert fixed.sla.p99_ms == 250.0 and fixed.sla_scale == ()
    assert override(fixed, sla_p99_ms="2x").sla_scale == (("p99_ms", 2.0),)
    with pytest.raises(ConfigError, match=r"^--sla-p99='x2': expected milliseconds"):
        override(study, sla_p99_ms="x2")
    # The defaults leave the fingerprint of a study written before these keys existed unchanged.
    plain = load_study(write(files, native()), devices={"cpu"})
    assert plain.strategy.finalists == 2 and plain.contention.retries == 2 and plain.families[0].load.early_stop
    assert (
        plain.fingerprint()
        != load_study(write(files, native(strategy={"finalists": 0})), devices={"cpu"}).fingerprint()
    )


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("20m", 1200), ("1h30m", 5400), (2.5, 2.5)])
def test_durations(text: str | float, seconds: float) -> None:
    assert duration("budget", text) == seconds


def test_unreadable_study_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_study(tmp_path / "none.yaml", devices={"cpu"})
    refused(tmp_path, "a: [", r"invalid YAML")
    refused(tmp_path, "- 1\n", r"expected a mapping at the top level")
