"""Figures the tuner can trust: finalists compared pairwise with an interval, trials that stop once decided, a
contended trial measured again and shown as such, an SLA sized to this machine, and a distinct exit status when
nothing meets it. The comparisons are unit-tested on made-up trials; two studies run on real servers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from servetune.bench.recording import Recording
from servetune.tune import Config, load_study, tune
from servetune.tune import finalists as final
from servetune.tune.confidence import decider
from servetune.tune.report import describe, finalist_lines
from servetune.tune.study import Sla
from servetune.tune.trial import Trial
from tune_models import cost_archive
from tune_synthetic import family, result, study

A, B = Config("eager/cpu", 2, 1, 10), Config("eager/cpu", 1, 2, 10)


def rounds(a: list[float], b: list[float]) -> list[Trial]:
    """The search's one trial of each, then interleaved finalist rounds (A, B, A, B, ...) with these throughputs."""
    trials = [Trial(0, A, 0, "ok", result(max(a), 100.0)), Trial(1, B, 0, "ok", result(max(b), 100.0))]
    for x, y in zip(a, b, strict=True):
        for config, rps in ((A, x), (B, y)):
            repeat = sum(t.config == config for t in trials)
            trials.append(Trial(len(trials), config, repeat, "ok", result(rps, 100.0), phase="finalist"))
    return trials


def test_finalists_are_chosen_and_measured_interleaved() -> None:
    s = study(family(workers=(1, 2), batch=(1, 2), delays=(10,)), p99_ms=300)
    searched = [Trial(0, A, 0, "ok", result(100.0, 100.0)), Trial(1, B, 0, "ok", result(95.0, 100.0)),
                Trial(2, Config("eager/cpu", 1, 1, 10), 0, "ok", result(50.0, 100.0))]  # fmt: skip
    chosen = final.choose_finalists(s, searched)
    assert chosen == [A, B]  # within 10% of the best; the third serves half as much
    trials = list(searched)
    order = []
    for proposal in final.plan(s, chosen, trials):
        order.append((proposal.config, proposal.repeat, proposal.phase))
        trials.append(Trial(len(trials), proposal.config, proposal.repeat, "ok", result(90.0, 100.0), phase="finalist"))
    assert order == [(A, 1, "finalist"), (B, 1, "finalist"), (A, 2, "finalist"), (B, 2, "finalist"),
                     (A, 3, "finalist"), (B, 3, "finalist")]  # fmt: skip
    assert list(final.plan(s, chosen, trials)) == []  # all rounds measured: a resumed study measures none again
    assert final.choose_finalists(s, trials) == chosen  # the rounds do not change who the finalists are


def test_the_finalists_are_the_best_and_the_simplest_near_it() -> None:
    """Three configs within 10% of each other: which came second is the machine's drift, so the best is compared
    with the simplest of the others, whatever their order."""
    s = study(family(workers=(1, 2, 4), batch=(1, 2), delays=(10,)), p99_ms=300)
    wide, simple = Config("eager/cpu", 4, 1, 10), Config("eager/cpu", 1, 1, 10)
    for second, third in ((B, simple), (simple, B)):
        searched = [
            Trial(i, config, 0, "ok", result(rps, 100.0))
            for i, (config, rps) in enumerate(((wide, 100.0), (second, 97.0), (third, 93.0), (A, 85.0)))
        ]
        # A (2 x 1) is 15% behind, out of the band, but it is 4 x 1 one step simpler: compared too
        assert final.choose_finalists(s, searched) == [wide, simple, A]
    s3 = replace(s, strategy=replace(s.strategy, finalists=3))
    assert final.choose_finalists(s3, searched) == [wide, simple, B, A]


def test_the_best_is_compared_with_its_simpler_neighbours_unless_they_were_measured_far_behind() -> None:
    """2 x 4 wins the search: the configs one step simpler are 1 x 4 (a worker fewer) and 2 x 2 (a smaller batch).
    Each is a finalist when the search never measured it or measured it within 25%, not when it measured it further
    behind or missing the SLA (1 x 4, measured at half, is none)."""
    s = study(family(workers=(1, 2, 3), batch=(1, 2, 4, 8), delays=(25,)), p99_ms=300)
    space = [Config("eager/cpu", w, b, 25) for w in (1, 2, 3) for b in (1, 2, 4, 8)]
    best, near, fewer, half = (Config("eager/cpu", 2, 4, 25), Config("eager/cpu", 2, 2, 25),
                               Config("eager/cpu", 1, 4, 25), Config("eager/cpu", 1, 8, 25))  # fmt: skip
    searched = [Trial(0, best, 0, "ok", result(100.0, 200.0)), Trial(1, half, 0, "ok", result(95.0, 250.0)),
                Trial(2, fewer, 0, "ok", result(50.0, 150.0))]  # fmt: skip
    assert final.choose_finalists(s, searched, space) == [best, half, near]  # never measured
    for rps, p99, finalist in ((80.0, 150.0, True), (70.0, 150.0, False), (99.0, 400.0, False)):
        measured = [*searched, Trial(3, near, 0, "ok", result(rps, p99))]
        assert (near in final.choose_finalists(s, measured, space)) is finalist, (rps, p99)
        assert fewer not in final.choose_finalists(s, measured, space)
    assert final.choose_finalists(s, searched) == [best, half]  # only the measured configs: 2 x 2 is not among them
    crowded = [*searched, Trial(3, near, 0, "ok", result(60.0, 150.0, others_cores=0.63))]
    assert near in final.choose_finalists(s, crowded, space)  # measured far behind, but only while others ran
    unmeasured = [t for t in searched if t.config != fewer]
    assert final.choose_finalists(s, unmeasured, space) == [best, half, near, fewer]  # both, least simple first


def test_when_the_rounds_best_is_not_the_searchs_its_simpler_neighbours_are_compared_in_a_second_set() -> None:
    """The search's best is 3 x 4; the rounds put 2 x 4 ahead of it. 2 x 4's simpler neighbours were never
    compared with it (1 x 4 was measured far behind: out; 2 x 2 never measured): 2 x 4 and 2 x 2 get a second set of
    interleaved rounds, and 2 x 2, indistinguishable from 2 x 4 on them, is chosen."""
    from servetune.tune.analysis import analyse

    s = study(family(workers=(1, 2, 3), batch=(1, 2, 4, 8), delays=(25,)), p99_ms=300)
    space = [Config("eager/cpu", w, b, 25) for w in (1, 2, 3) for b in (1, 2, 4, 8)]
    top, ahead, narrow, fewer, near = (Config("eager/cpu", 3, 4, 25), Config("eager/cpu", 2, 4, 25),
                                       Config("eager/cpu", 3, 2, 25), Config("eager/cpu", 1, 4, 25),
                                       Config("eager/cpu", 2, 2, 25))  # fmt: skip
    searched = ((top, 100.0), (ahead, 95.0), (narrow, 60.0), (fewer, 40.0))
    trials = [Trial(i, config, 0, "ok", result(rps, 150.0)) for i, (config, rps) in enumerate(searched)]
    first = final.choose_finalists(s, trials, space)
    assert first == [top, ahead]

    def measure(configs: list[Config], phase: str, figures: dict[Config, list[float]]) -> list[Config]:
        order = []
        for proposal in final.plan(s, configs, trials, phase=phase):
            order.append(proposal.config)
            rps = figures[proposal.config][sum(t.config == proposal.config and t.phase == phase for t in trials)]
            trials.append(Trial(len(trials), proposal.config, proposal.repeat, "ok", result(rps, 150.0), phase=phase))
            if phase == final.PHASE and len(order) == 1:  # first rounds under way: no second set yet
                assert final.second_finalists(s, trials, first, space) == []
        return order

    measure(first, final.PHASE, {top: [90.0, 92.0, 91.0], ahead: [100.0, 101.0, 99.0]})
    second = final.second_finalists(s, trials, first, space)
    assert second == [ahead, near]  # 1 x 4, measured at 40% of 2 x 4 in the search, is ruled out
    assert measure(second, final.SECOND, {ahead: [100.0, 97.0, 102.0], near: [98.0, 99.0, 100.0]}) == [
        ahead, near, ahead, near, ahead, near]  # fmt: skip
    assert final.all_finalists(s, trials, space) == [top, ahead, near]
    verdict = final.compare(s, trials, final.all_finalists(s, trials, space))
    assert verdict is not None and verdict.best == ahead and verdict.chosen == near
    by_other = {c.other: c for c in verdict.comparisons}
    assert by_other[top].rounds == 3 and by_other[near].rounds == 3
    # 2 x 4 against 2 x 2: the second set's rounds paired with each other, not with the first set's
    assert by_other[near].ratio == pytest.approx((100 / 98 * 97 / 99 * 102 / 100) ** (1 / 3))
    assert by_other[top].ratio == pytest.approx((100 / 90 * 101 / 92 * 99 / 91) ** (1 / 3))
    analysis = analyse(s, trials)
    assert analysis.winner is not None and analysis.winner.config == near
    assert list(final.plan(s, second, trials, phase=final.SECOND)) == []  # a resumed study measures none again
    # when the rounds agree with the search, no second set
    agreeing = [t for t in trials if t.phase != final.SECOND]
    agreeing = [t if t.config != top or t.phase != final.PHASE else replace(t, result=result(120.0, 150.0))
                for t in agreeing]  # fmt: skip
    assert final.second_finalists(s, agreeing, first, space) == []


def test_a_clear_difference_is_named_with_its_interval() -> None:
    s = study(family(workers=(1, 2), batch=(1, 2), delays=(10,)), p99_ms=300)
    verdict = final.compare(s, rounds([100.0, 102.0, 101.0], [80.0, 81.0, 79.0]), [A, B])
    assert verdict is not None and verdict.chosen == A and len(verdict.comparisons) == 1
    comparison = verdict.comparisons[0]
    assert comparison.distinguishable and comparison.rounds == 3
    assert comparison.ratio == pytest.approx((100 / 80 * 102 / 81 * 101 / 79) ** (1 / 3))
    assert comparison.low is not None and comparison.high is not None and 1.0 < comparison.low < comparison.high
    text = final.sentence(comparison, lambda p: describe(p, s))
    assert text.startswith("eager on cpu, 2 workers, batch 1, delay 10 ms beats eager on cpu, 1 worker, batch 2")
    assert "by 26% (95% CI" in text and "3 interleaved rounds" in text


def test_indistinguishable_finalists_give_the_simpler_one() -> None:
    s = study(family(workers=(1, 2), batch=(1, 2), delays=(10,)), p99_ms=300)
    trials = rounds([100.0, 95.0, 105.0], [98.0, 102.0, 96.0])
    verdict = final.compare(s, trials, [A, B])
    assert verdict is not None and not verdict.comparisons[0].distinguishable
    assert verdict.chosen == B  # 1 worker x batch 2 is cheaper than 2 workers x batch 1
    assert "indistinguishable at this noise level" in verdict.reason and "simpler (cheaper)" in verdict.reason
    from servetune.tune.analysis import analyse

    analysis = analyse(s, trials)
    assert analysis.winner is not None and analysis.winner.config == B
    lines = finalist_lines(analysis, s)
    assert "indistinguishable at this noise level" in lines[0] and lines[-1].startswith("Chosen: eager on cpu, 1 w")


def test_a_simpler_finalist_far_behind_on_noisy_rounds_is_not_chosen() -> None:
    """Rounds so noisy that 1.6x cannot be told from 1: the interval holds 1, but the simpler one is not chosen on
    noise; within 10% it is."""
    s = study(family(workers=(1, 2), batch=(1, 2), delays=(10,)), p99_ms=300)
    verdict = final.compare(s, rounds([100.0, 160.0, 60.0], [40.0, 100.0, 50.0]), [A, B])
    assert verdict is not None and not verdict.comparisons[0].distinguishable
    assert verdict.comparisons[0].ratio > 1.5 and verdict.chosen == A
    assert "not chosen on noise" in verdict.reason
    close = final.compare(s, rounds([100.0, 130.0, 80.0], [95.0, 110.0, 90.0]), [A, B])
    assert close is not None and close.comparisons[0].ratio <= 1 / final.BAND and close.chosen == B


def test_a_finalist_that_misses_on_its_rounds_is_out() -> None:
    s = study(family(workers=(1, 2), batch=(1, 2), delays=(10,)), p99_ms=300)
    trials = rounds([100.0, 100.0, 100.0], [90.0, 90.0, 90.0])
    trials = [t if t.config != A or t.phase != "finalist" else Trial(t.index, A, t.repeat, "ok", result(100.0, 400.0),
                                                                     phase="finalist") for t in trials]  # fmt: skip
    verdict = final.compare(s, trials, [A, B])
    assert verdict is not None and verdict.chosen == B and verdict.comparisons == ()


def recording(latency_ms: list[float], seconds: float) -> Recording:
    rec = Recording()
    for i, lat in enumerate(latency_ms):
        rec.add(i * seconds / len(latency_ms), lat, 200, 0.0, lat, 1)
    return rec


def test_a_run_stops_once_its_figures_decide() -> None:
    sla = Sla(p99_ms=100.0)
    enough = decider(sla, best_rps=None)
    # A clear miss shows in a few dozen samples: their lower bound on P99 is already over the limit.
    assert enough(recording([500.0] * 40, 1.0), 1.0)
    assert not enough(recording([500.0] * 20, 1.0), 1.0)  # too few to say anything
    # A clear pass needs an upper bound on P99 within the limit (299 samples or more) and a tight throughput.
    assert not enough(recording([10.0] * 200, 2.0), 2.0)
    assert enough(recording([10.0] * 1000, 2.0), 2.0)
    # On the line: P99 straddles the limit, so the run goes on.
    rng = np.random.default_rng(0)
    near = list(rng.uniform(50, 100, 985)) + list(rng.uniform(100, 110, 15))
    assert not enough(recording(near, 2.0), 2.0)
    # Clearly below the best config's throughput (500 req/s against 1000): it cannot win.
    assert decider(sla, best_rps=1000.0)(recording([10.0] * 1000, 2.0), 2.0)


def cost_study(folder: Path, model: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "model": "cost",
        "archive": str(model),
        "space": {"workers": [1], "batch_size": [1], "batch_delay_ms": [10]},
        "load": {"duration": "1s", "warmup": "0.3s"},
        "strategy": {"name": "grid", "remeasure": 0, "finalists": 0},
        **changes,
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cost")
    return cost_archive(folder / "store", folder / "locks", a_ms=40, b_ms=0, slots=1)


def test_a_core_burnt_by_another_process_makes_a_contended_trial(tmp_path: Path, model: Path) -> None:
    # The study replays a trace (20 req/s for 1.5 s; the model serves 25) while another process burns a core.
    (tmp_path / "trace.csv").write_text("t_ms\n" + "".join(f"{50 * i}\n" for i in range(30)))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(1)]
    try:
        time.sleep(0.3)
        path = cost_study(tmp_path, model, sla={"p99_ms": 2000}, load={"trace": "trace.csv", "warmup": 0},
                          contention={"max_other_cores": 0.25, "retries": 1})  # fmt: skip
        done = tune(load_study(path), tmp_path / "out")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    (trial,) = done.trials
    assert trial.status == "ok" and trial.result is not None and trial.result.host is not None
    # The burner used a core all along: both runs were contended; the trial says so and keeps the less disturbed.
    assert trial.contended and len(trial.attempts) == 2 and trial.remeasured == 1
    assert sum(a.kept for a in trial.attempts) == 1 and all(a.contended for a in trial.attempts)
    assert trial.result.host.others_cores >= 0.25
    # Judged on the whole trace, with its goodput and attainment.
    assert trial.load["trace"].startswith("trace.csv (csv)") and trial.result.sent == 30
    assert trial.result.slo is not None and trial.result.slo.sent == 30 and trial.result.mode == "open"
    report = (tmp_path / "out" / "report.md").read_text()
    assert "contended" in report and "measured again" in report
    row = (tmp_path / "out" / "trials.csv").read_text().splitlines()
    header = row[0].split(",")
    assert "Interference" in header and "contended:" in row[1]
    saved = json.loads((tmp_path / "out" / "trials.jsonl").read_text().splitlines()[1])
    assert len(saved["attempts"]) == 2 and saved["result"]["host"]["contended"]


def test_an_sla_sized_to_this_machine_and_finalists(tmp_path: Path, model: Path) -> None:
    # One slot of 40 ms: 2 workers serve no more than 1, so the two finalists tie and the simpler may win.
    path = cost_study(
        tmp_path, model, sla={"p99_ms": "10x"}, space={"workers": [1, 2], "batch_size": [1], "batch_delay_ms": [10]},
        strategy={"name": "grid", "remeasure": 0, "finalists": 2, "rounds": 2},
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "servetune", "tune", str(path), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    # 1 worker: 1 client, ~42 ms a request; 2 workers: 2 clients take turns, ~84 ms; the SLA: 10 x ~42 ms.
    assert done.returncode == 0, done.stderr
    assert "SLA for this machine: P99 <= 10 x the single-request latency" in done.stderr
    calibration = json.loads((tmp_path / "out" / "calibration.json").read_text())
    assert 40.0 <= calibration["single_request_ms"] < 400.0
    report = (tmp_path / "out" / "report.md").read_text()
    limit = round(10 * calibration["single_request_ms"], 1)
    assert f"P99 <= {limit:g} ms" in report
    lines = [json.loads(line) for line in (tmp_path / "out" / "trials.jsonl").read_text().splitlines()[1:]]
    phases = [(line["config"]["workers"], line["phase"]) for line in lines]
    assert phases[:2] == [(1, ""), (2, "")]
    if len(phases) == 2:
        # Noise put one more than 10% behind the other: a single finalist, nothing to compare.
        assert "## Finalists" not in report
        return
    first, second = phases[2][0], 3 - phases[2][0]  # the best finalist first, then in turns
    assert phases[2:] == [(first, "finalist"), (second, "finalist"), (first, "finalist"), (second, "finalist")]
    assert "## Finalists" in report and "Chosen: eager on cpu" in done.stdout
    if "indistinguishable at this noise level" in done.stdout:
        # Two rounds leave a wide interval (Student's t with 1 degree of freedom: 12.7): the simpler config wins,
        # unless it measured more than 10% behind on the rounds (``final.BAND``: a CI run here, with 1.5 cores taken
        # by other processes, measured the two finalists 1.141 apart): then the best is kept and the report says why.
        [ratio] = [float(m) for m in re.findall(r"noise level \(ratio ([0-9.]+)", done.stdout)]
        simpler = "Chosen: eager on cpu, 1 worker, batch 1" in done.stdout
        kept = "Chosen: eager on cpu, 2 workers, batch 1" in done.stdout and "not chosen on noise" in done.stdout
        if first == 1:  # the best is the simpler one
            assert simpler, done.stdout
        elif abs(ratio - 1 / final.BAND) > 0.001:  # the ratio is printed to 3 decimals
            assert simpler if ratio < 1 / final.BAND else kept, done.stdout
        else:
            assert simpler or kept, done.stdout
