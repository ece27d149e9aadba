"""The static winner or the online controller: a trace study's winner replayed against the same archive with the
controller switched on, in interleaved rounds, and the one that answered more of the trace inside the SLA (by more
than the rounds' noise) deployed. The verdict is unit-tested on made-up rounds whose answer is computed by hand; one
study runs on a real server, and its verdict is recomputed from the trials it wrote."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from servetune._exceptions import ConfigError
from servetune.bench.slo import SloFigures
from servetune.control import parse_settings
from servetune.tune import Config, deploy, load_study, online, tune
from servetune.tune import finalists as final
from servetune.tune.analysis import analyse
from servetune.tune.study import Load, Sla, StrategySpec
from servetune.tune.targets import target_kind
from servetune.tune.trial import Trial
from tune_models import cost_archive
from tune_synthetic import family, result, study

STATIC = Config("eager/cpu", 2, 4, 10)


def trace_study():
    s = study(family(workers=(1, 2), batch=(1, 4), delays=(10,), load=Load(mode="trace")), p99_ms=300)
    return dataclasses.replace(s, strategy=StrategySpec("grid", 0, 0, 3, controller=True))


def measured(attainment: float, p99: float = 200.0) -> object:
    base = result(50.0, p99)
    sent = 1000
    good = round(attainment * sent)
    figures = SloFigures(Sla(p99_ms=300), 300.0, sent, good, good / 20.0, attainment, attainment, 10.0)
    return dataclasses.replace(base, slo=figures)


def rounds(static: list[float], controller: list[float]) -> tuple[list[Trial], Config]:
    """The search's trial of the winner, then interleaved rounds with these attainments (static first)."""
    s = trace_study()
    found = online.controlled(s, STATIC)
    assert found is not None
    _, ours = found
    trials = [Trial(0, STATIC, 0, "ok", measured(0.99))]
    for a, b in zip(static, controller, strict=True):
        for config, share in ((STATIC, a), (ours, b)):
            repeat = sum(t.config == config for t in trials)
            trials.append(Trial(len(trials), config, repeat, "ok", measured(share), phase=online.PHASE))
    return trials, ours


def test_the_controller_family_is_the_winners_with_its_section_and_outside_the_space() -> None:
    s = trace_study()
    found = online.controlled(s, STATIC)
    assert found is not None
    extended, ours = found
    assert ours == dataclasses.replace(STATIC, family="eager/cpu+controller")
    fam = extended.family(ours.family)
    assert fam.model_config["controller"] == {
        "slo": {"p99_ms": 300},
        "bounds": {"batch_size": [1, 4], "max_batch_delay_ms": [10, 10], "workers": [1, 2]},
        "shed": True,
    }
    assert extended.families == s.families  # not searched
    # read back from a checkpoint, the family is known again
    trials, _ = rounds([0.9], [0.99])
    assert online.restore(s, trials).family(ours.family) == fam


def test_searched_thread_counts_become_the_controllers_thread_bounds() -> None:
    searched = dataclasses.replace(family(workers=(1, 2), batch=(1, 4), delays=(10,)), threads=(0, 1, 2, 4))
    section = deploy.controller_section(Sla(p99_ms=300), searched)
    assert section is not None and section["bounds"]["threads"] == [1, 4]  # 0, the automatic share, is no bound
    parse_settings(section)  # what the server accepts
    one = dataclasses.replace(searched, threads=(0, 2))
    assert "threads" not in deploy.controller_section(Sla(p99_ms=300), one)["bounds"]  # type: ignore[index]


def test_on_ray_the_controllers_bounds_are_a_replicas_batching_only() -> None:
    searched = dataclasses.replace(family(workers=(1, 2), batch=(1, 4), delays=(0, 10)), threads=(1, 2))
    section = deploy.controller_section(Sla(p99_ms=300), searched, target_kind("ray").controller_knobs)
    assert section is not None and section["bounds"] == {"batch_size": [1, 4], "max_batch_delay_ms": [0, 10]}
    native = deploy.controller_section(Sla(p99_ms=300), searched, target_kind("native").controller_knobs)
    assert native is not None and set(native["bounds"]) == {"batch_size", "max_batch_delay_ms", "workers", "threads"}


def test_the_rounds_are_interleaved_and_a_resumed_study_measures_only_what_it_lacks() -> None:
    s = trace_study()
    _, ours = online.controlled(s, STATIC) or (None, None)
    assert ours is not None
    trials = [Trial(0, STATIC, 0, "ok", measured(0.99))]
    order = []
    for proposal in online.plan(s, STATIC, ours, trials):
        order.append((proposal.config, proposal.repeat))
        trials.append(Trial(len(trials), proposal.config, proposal.repeat, "ok", measured(0.99), phase=online.PHASE))
    assert order == [(STATIC, 1), (ours, 0), (STATIC, 2), (ours, 1), (STATIC, 3), (ours, 2)]
    assert list(online.plan(s, STATIC, ours, trials)) == []


def test_the_rounds_do_not_move_the_finalists() -> None:
    s = study(family(workers=(1, 2), batch=(1, 2), delays=(10,)), p99_ms=300)
    a, b = Config("eager/cpu", 2, 1, 10), Config("eager/cpu", 1, 2, 10)
    searched = [Trial(0, a, 0, "ok", result(100.0, 100.0)), Trial(1, b, 0, "ok", result(95.0, 100.0))]
    rounds_of_b = [Trial(2, b, 1, "ok", result(300.0, 100.0), phase=online.PHASE)]  # counted, b would lead
    assert final.choose_finalists(s, searched + rounds_of_b) == final.choose_finalists(s, searched) == [a, b]


def test_a_controller_that_answers_clearly_more_inside_the_sla_is_deployed() -> None:
    trials, _ = rounds([0.950, 0.960, 0.940], [0.995, 0.999, 0.997])
    verdict = online.compare(trace_study(), trials)
    assert verdict is not None and verdict.use_controller
    diffs = [0.045, 0.039, 0.057]  # by hand: each controller round minus the static round before it
    assert verdict.difference == pytest.approx(sum(diffs) / 3)
    sd = math.sqrt(sum((d - sum(diffs) / 3) ** 2 for d in diffs) / 2)
    assert verdict.low == pytest.approx(sum(diffs) / 3 - 4.303 * sd / math.sqrt(3), abs=1e-4)
    assert verdict.static.attainment == pytest.approx(0.95) and verdict.controller.attainment == pytest.approx(0.997)
    assert "+4.70 points of attainment" in verdict.sentence() and "3 interleaved rounds" in verdict.sentence()


def test_rounds_left_in_a_checkpoint_decide_nothing_once_the_study_stops_asking() -> None:
    trials, _ = rounds([0.950, 0.960, 0.940], [0.995, 0.999, 0.997])
    asking = trace_study()
    assert analyse(asking, trials).online is not None
    stopped = dataclasses.replace(asking, strategy=dataclasses.replace(asking.strategy, controller=False))
    assert analyse(stopped, trials).online is None  # the deployment stays static


def test_a_controller_no_better_or_within_the_noise_keeps_the_static_winner() -> None:
    worse, _ = rounds([0.999, 0.998, 0.999], [0.990, 0.995, 0.992])
    verdict = online.compare(trace_study(), worse)
    assert verdict is not None and not verdict.use_controller and "did no better" in verdict.reason
    noisy, _ = rounds([0.990, 0.999, 0.980], [0.999, 0.990, 0.999])  # +0.009, -0.009, +0.019: the CI holds 0
    verdict = online.compare(trace_study(), noisy)
    assert verdict is not None and not verdict.use_controller
    assert verdict.low is not None and verdict.low < 0 < verdict.difference
    assert "could not be told better" in verdict.reason
    assert online.compare(trace_study(), noisy[:1]) is None  # no rounds: no verdict


def test_the_comparison_needs_a_trace_and_a_latency_sla(tmp_path: Path) -> None:
    model = cost_archive(tmp_path / "store", tmp_path / "locks", a_ms=5, b_ms=0, slots=1)
    data = {"model": "cost", "archive": str(model), "sla": {"p99_ms": 300},
            "space": {"workers": [1], "batch_size": [1], "batch_delay_ms": [10]},
            "strategy": {"name": "grid", "controller": True}}  # fmt: skip
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"strategy.controller=true: the controller is compared on a trace load"):
        load_study(path)
    path.write_text(yaml.safe_dump({**data, "strategy": {"name": "grid", "controller": "yes"}}))
    with pytest.raises(ConfigError, match=r"strategy.controller='yes': expected true or false"):
        load_study(path)
    # On a trace it is read; it adds rounds after the search and changes no trial: the fingerprint stays (a study
    # resumed with it on reuses the trials measured without it).
    (tmp_path / "trace.csv").write_text("t_ms\n0\n10\n")
    on_trace = {**data, "load": {"trace": "trace.csv"}}
    path.write_text(yaml.safe_dump({**on_trace, "strategy": {"name": "grid"}}))
    without = load_study(path)
    path.write_text(yaml.safe_dump({**on_trace, "strategy": {"name": "grid", "controller": True}}))
    with_it = load_study(path)
    assert with_it.strategy.controller and not without.strategy.controller
    assert with_it.fingerprint() == without.fingerprint()


def test_a_trace_study_compares_its_winner_with_the_controller_on_a_real_server(tmp_path: Path) -> None:
    # One slot of 20 ms a batch whatever its size; the trace: 40 requests, 50 ms apart, then 20 within 100 ms.
    model = cost_archive(tmp_path / "store", tmp_path / "locks", a_ms=20, b_ms=0, slots=1)
    times = [50 * i for i in range(40)] + [2000 + 5 * i for i in range(20)]
    (tmp_path / "trace.csv").write_text("t_ms\n" + "".join(f"{t}\n" for t in times))
    data = {"model": "cost", "archive": str(model), "sla": {"p99_ms": 400},
            "space": {"workers": [1, 2], "batch_size": [1, 4], "batch_delay_ms": [5]},
            "load": {"trace": "trace.csv", "warmup": 0},
            "strategy": {"name": "grid", "remeasure": 0, "finalists": 0, "rounds": 2, "controller": True}}  # fmt: skip
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    done = tune(load_study(path), tmp_path / "out")
    assert done.analysis.winner is not None
    winner = done.analysis.winner.config
    ours = [t for t in done.trials if t.phase == online.PHASE]
    # static, controller, static, controller: the winner's knobs in both families
    assert [t.config.family for t in ours] == ["eager/cpu", "eager/cpu+controller"] * 2
    assert all(dataclasses.replace(t.config, family="eager/cpu") == winner for t in ours)
    assert all(t.status == "ok" and t.result is not None and t.result.sent == 60 for t in ours)
    # the controller's archive was served with its section (the study's SLA, the searched ranges)
    served = yaml.safe_load((tmp_path / "out" / "store" / "eager-cpu-controller" / "model-config.yaml").read_text())
    assert served["controller"]["slo"] == {"p99_ms": 400} and served["controller"]["bounds"]["workers"] == [1, 2]
    # the verdict, recomputed from the trials the study wrote
    lines = [json.loads(line) for line in (tmp_path / "out" / "trials.jsonl").read_text().splitlines()[1:]]
    mine = [line for line in lines if line["phase"] == online.PHASE]
    shares = [line["result"]["slo"]["good"] / line["result"]["slo"]["sent"] for line in mine]
    diffs = [shares[1] - shares[0], shares[3] - shares[2]]
    verdict = done.analysis.online
    assert verdict is not None and verdict.pairs == 2
    assert verdict.difference == pytest.approx(sum(diffs) / 2)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Static winner or online controller" in report and verdict.sentence() in report
    deployed = yaml.safe_load((tmp_path / "out" / "deploy" / "model-config.yaml").read_text())
    assert ("controller" in deployed) == verdict.use_controller
    assert (tmp_path / "out" / "deploy" / "model-config.controller.yaml").exists() != verdict.use_controller
    # the search's figures leave the rounds out: the controller's family is not a config of the space
    assert all(s.config.family == "eager/cpu" for s in done.analysis.summaries)
