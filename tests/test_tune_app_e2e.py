"""An app of two models tuned end to end on a real server: the best way to share the cores is found.

Two models with known costs (``tune_models.py``), called one after the other (a pipeline: A's answer is B's
request), batch 1: A costs 160 ms a call, B 80 ms, and every call of either holds one of 2 slots they share (the
host's 2 cores). Closed loop with one client per worker; SLA: mean end-to-end latency <= 420 ms.

By hand (``pipeline_by_hand``): A alone is best with 2 workers (12.5 calls/s: one per slot), B alone with 2
workers (25/s). Together they share the slots: a pipeline keeps a slot busy for 160 + 80 ms, so the app cannot
pass 2 / 0.24 s = 8.3 pipelines/s. 2 workers of A and 1 of B reach it in 3 / 8.3 = 360 ms; the solo bests
together (2 + 2 workers) reach no more, with one client more: 480 ms, a miss; 1 + 2 is held at A's 6.25/s. So the
app's best split differs from putting each model's solo best side by side. (The costs are large so that a few
tens of ms of serving per call on a busy machine cannot move a config across the SLA.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from servetune.tune import AppConfig, Config, TuneResult, load_study, tune
from tune_models import cost_archive, expected_closed_loop, pipeline_by_hand

COSTS = {"a": 160.0, "b": 80.0}
SLOTS, SLA_MS, WORKERS = 2, 420.0, [1, 2, 3]

pytestmark = pytest.mark.slow  # about a minute: a real server, two models, timed load runs


def part(model: str, workers: int) -> Config:
    return Config(f"{model}/eager/cpu", workers, 1, 10)


def solo_best(model: str) -> int:
    """A model alone on the slots: the fewest workers with the most throughput."""
    scored = [(expected_closed_loop(COSTS[model] - 20, 20, SLOTS, w, 1)[0], -w) for w in WORKERS]
    return -max(scored)[1]


def app_best() -> AppConfig:
    feasible = []
    for wa in WORKERS:
        for wb in WORKERS:
            throughput, latency = pipeline_by_hand(COSTS, {"a": wa, "b": wb}, SLOTS)
            if latency <= SLA_MS - 30:  # room for serving overhead
                feasible.append((throughput, -wa - wb, AppConfig((part("a", wa), part("b", wb)))))
    return max(feasible, key=lambda item: item[:2])[2]


def test_by_hand_the_apps_best_split_is_not_the_solo_bests_side_by_side() -> None:
    assert (solo_best("a"), solo_best("b")) == (2, 2)
    assert app_best() == AppConfig((part("a", 2), part("b", 1)))
    assert pipeline_by_hand(COSTS, {"a": 2, "b": 2}, SLOTS)[1] > SLA_MS  # the solo bests together miss


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> TuneResult:
    folder = tmp_path_factory.mktemp("app")
    locks = folder / "locks"  # one lock folder: the two models share the slots
    for name, cost in COSTS.items():
        cost_archive(folder / "store", locks, a_ms=cost - 20, b_ms=20, slots=SLOTS, name=name)
    (folder / "input.txt").write_text("hello")
    space = {"workers": WORKERS, "batch_size": [1], "batch_delay_ms": [10]}
    study: dict[str, Any] = {
        "app": "two",
        "models": {
            "a": {"archive": "store/a.mar", "input": "input.txt", "space": space},
            "b": {"archive": "store/b.mar", "space": space},
        },
        "pipeline": ["a", "b"],
        "sla": {"mean_ms": SLA_MS},
        "load": {"duration": "3s", "warmup": "0.5s"},
        "strategy": {"name": "adaptive", "remeasure": 1, "finalists": 0},
        "contention": {"retries": 0},
        "references": {"each model's solo best": {"a": {"workers": 2}, "b": {"workers": 2}}},
    }
    (folder / "app.yaml").write_text(yaml.safe_dump(study))
    return tune(load_study(folder / "app.yaml"), folder / "out")


def test_the_tuner_finds_the_apps_best_split(tuned: TuneResult) -> None:
    winner = tuned.analysis.winner
    assert winner is not None and winner.config == app_best(), [(t.config.key, t.status) for t in tuned.trials]
    assert tuned.trials[0].config == AppConfig((part("a", 1), part("b", 1)))  # the default config first
    assert len({t.config for t in tuned.trials}) < 9  # the product was not enumerated
    assert all(t.status == "ok" for t in tuned.trials), [t.error for t in tuned.trials]
    # the throughput is the one computed by hand, within the serving overhead
    expected, _ = pipeline_by_hand(COSTS, {"a": 2, "b": 1}, SLOTS)
    assert winner.throughput_rps == pytest.approx(expected, rel=0.2)


def test_the_report_shows_each_models_figures_beside_the_apps(tuned: TuneResult) -> None:
    report = (tuned.out_dir / "report.md").read_text()
    [(label, solo)] = tuned.analysis.references
    assert label == "each model's solo best" and solo.config == AppConfig((part("a", 2), part("b", 2)))
    assert not solo.verdict.passed and "## Beside the references" in report
    assert "a: eager on cpu, 2 workers, batch 1, delay 10 ms; b: eager on cpu, 1 worker" in report
    assert "| model | config | throughput |" in report and "| a P99 | b P99 |" in report
    assert "the default config (each model: 1 worker, batch 1, eager)" in report
    csv_head = (tuned.out_dir / "trials.csv").read_text().splitlines()[0]
    assert "a P99" in csv_head and "b handler mean" in csv_head
    assert {p.name for p in tuned.plots} >= {"throughput_vs_p99.png", "heatmap-a-eager-cpu.png", "stages.png"}


def test_the_deployed_config_serves_both_models(tuned: TuneResult) -> None:
    deployment = tuned.deployment
    assert deployment is not None
    text = deployment.config_properties.read_text()
    assert "load_models=a=a,b=b" in text
    assert yaml.safe_load(deployment.model_configs["a"].read_text())["minWorkers"] == 2
    assert yaml.safe_load(deployment.model_configs["b"].read_text())["minWorkers"] == 1
    assert Path(deployment.folder / "model-store" / "b" / "MAR-INF" / "MANIFEST.json").exists()


def test_a_mix_is_loaded_in_its_shares_and_its_capacity_found(tmp_path: Path) -> None:
    """Two models loaded side by side, one request of A for two of B, each on its own slot: A (80 ms a call) serves
    12.5/s at most, B (40 ms) 25/s, so the app's capacity in these shares is at most 3 x 12.5 = 37.5 requests/s
    (A's share is a third): the open-loop search brackets it from below."""
    for name, cost in (("a", 80.0), ("b", 40.0)):
        cost_archive(tmp_path / "store", tmp_path / f"locks-{name}", a_ms=cost - 20, b_ms=20, slots=1, name=name)
    (tmp_path / "input.txt").write_text("hello")
    space = {"workers": [1], "batch_size": [1], "batch_delay_ms": [10]}
    study = {
        "app": "mixed",
        "models": {
            "a": {"archive": "store/a.mar", "input": "input.txt", "space": space},
            "b": {"archive": "store/b.mar", "input": "input.txt", "space": space},
        },
        "mix": {"a": 1, "b": 2},
        "sla": {"p99_ms": 500},
        "load": {"mode": "capacity", "duration": "2s", "warmup": "0.5s", "steps": 3},
        "strategy": {"name": "grid", "remeasure": 0, "finalists": 0},
        "contention": {"retries": 0},
    }
    (tmp_path / "app.yaml").write_text(yaml.safe_dump(study))
    result = tune(load_study(tmp_path / "app.yaml"), tmp_path / "out")
    [trial] = result.trials
    assert trial.status == "ok" and trial.result is not None and trial.capacity_rps is not None
    assert 0.4 * 37.5 < trial.capacity_rps < 1.15 * 37.5
    a, b = trial.result.stages["a"], trial.result.stages["b"]
    assert b.throughput_rps == pytest.approx(2 * a.throughput_rps, rel=0.15)  # the shares were kept
