"""Threads and core pinning as knobs of the search, on a real server: set through the management API between
trials, in place (the same worker processes), and read back from each worker (describe's ``numThreads`` and
``cpuCores``, which the worker process reports itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servetune.hardware import usable_cpus
from servetune.tune import TuneResult, load_study, tune
from tune_models import cost_archive

CPUS = len(usable_cpus())

pytestmark = pytest.mark.slow  # about 40 s: a real server, workers added and re-threaded


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> TuneResult:
    folder = tmp_path_factory.mktemp("threads")
    archive = cost_archive(folder / "store", folder / "locks", a_ms=20, b_ms=5, slots=2)
    study = {
        "model": "cost",
        "archive": str(archive),
        "sla": {"p99_ms": 2000},
        # the last config pins 2 workers x all the CPUs: more cores than there are, refused by the server
        "space": {"workers": [1, 2], "batch_size": [1], "threads": sorted({1, CPUS}), "pinning": [False, True]},
        "load": {"duration": "0.5s", "warmup": "0.2s"},
        "strategy": {"name": "grid", "remeasure": 0, "finalists": 0},
        "contention": {"retries": 0},
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return tune(load_study(folder / "study.yaml"), folder / "out")


def test_each_worker_runs_with_the_threads_and_cores_of_its_trial(tuned: TuneResult) -> None:
    checked = 0
    for trial in tuned.trials:
        config = trial.config.parts[0]
        if config.threads == 0 or trial.status != "ok":
            continue
        workers = trial.placement["cost"]
        assert len(workers) == config.workers
        assert all(w["numThreads"] == config.threads for w in workers), (config.key, workers)
        if config.pinning:
            cores = [set(w["cpuCores"]) for w in workers]
            assert all(len(c) == config.threads for c in cores), (config.key, workers)
            assert len(set().union(*cores)) == sum(len(c) for c in cores)  # disjoint
        checked += 1
    assert checked >= 5


def test_threads_and_pinning_change_in_place_between_trials(tuned: TuneResult) -> None:
    ones = [t for t in tuned.trials if t.status == "ok" and t.config.parts[0].workers == 1 and t.placement]
    assert len({(t.config.parts[0].threads, t.config.parts[0].pinning) for t in ones}) >= 3
    assert len({t.placement["cost"][0]["pid"] for t in ones}) == 1  # the same worker process all along


def test_core_sets_that_do_not_fit_are_refused_naming_the_key(tuned: TuneResult) -> None:
    refused = [t for t in tuned.trials if t.config.parts[0].workers * t.config.parts[0].threads > CPUS
               and t.config.parts[0].pinning]  # fmt: skip
    assert refused and all(t.status == "error" and "cpuPinning" in t.error for t in refused)
    report = (tuned.out_dir / "report.md").read_text()
    assert "thread" in report and tuned.analysis.winner is not None


def test_the_winner_is_deployed_with_its_threads(tuned: TuneResult) -> None:
    assert tuned.deployment is not None and tuned.analysis.winner is not None
    written = yaml.safe_load(tuned.deployment.model_config.read_text())
    winner = tuned.analysis.winner.config.parts[0]
    assert written.get("numThreads") == winner.threads and written.get("cpuPinning", False) == winner.pinning
    assert Path(tuned.deployment.folder / "model-store" / "cost").is_dir()
