"""Reports, plots and the checkpoint, from trials of a closed-form model (no server needed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from servetune.bench.report import TORCHSERVE_COLUMNS
from servetune.tune.analysis import analyse, pareto_front
from servetune.tune.checkpoint import Checkpoint
from servetune.tune.plots import figures, fits, number, write_plots
from servetune.tune.report import headline, markdown, write_trials_csv
from servetune.tune.study import Config
from servetune.tune.trial import Trial
from tune_synthetic import cost_model, drive, family, study


def test_trials_csv_has_torchserve_columns_then_ours(tmp_path: Path) -> None:
    s = study(family(workers=(1, 2), batch=(1, 4, 16), delays=(10,)), strategy="grid", remeasure=0)
    trials = drive(s, cost_model())
    trials.append(Trial(len(trials), Config("eager/cpu", 2, 16, 10), 1, "error", error="HTTP 500: no workers"))
    path = write_trials_csv(trials, s, tmp_path / "trials.csv")
    with path.open() as handle:
        reader = csv.DictReader(handle)
        header, rows = reader.fieldnames or [], list(reader)
    assert header[: len(TORCHSERVE_COLUMNS)] == list(TORCHSERVE_COLUMNS)
    assert header[-6:] == ["Setup s", "Wall s", "Reason", "Phase", "Interference", "Runs measured again"]
    assert "SLA pass" in header
    assert len(rows) == len(trials)
    by_config = {(r["Workers"], r["Batch size"], r["Repeat"]): r for r in rows}
    assert by_config[("2", "4", "0")]["SLA pass"] == "pass"
    assert by_config[("2", "16", "0")]["SLA pass"] == "fail" and "P99" in by_config[("2", "16", "0")]["SLA miss"]
    error = by_config[("2", "16", "1")]
    assert error["Status"] == "error" and error["TS throughput"] == "" and error["Error"] == "HTTP 500: no workers"


def test_report_gives_the_winner_against_the_default_config(tmp_path: Path) -> None:
    s = study(family(workers=(1, 2, 3), batch=(1, 4, 16), delays=(10,)))
    trials = drive(s, cost_model())
    analysis = analyse(s, trials)
    assert analysis.winner is not None and analysis.winner.config == Config("eager/cpu", 2, 4, 10)
    assert analysis.baseline is not None and analysis.baseline.config == s.baseline
    assert analysis.speedup is not None and 4.5 < analysis.speedup < 5.5  # 44 req/s against 8.3
    text = headline(analysis, s)
    assert text.startswith("eager on cpu, 2 workers, batch 4, delay 10 ms:")
    assert f"It serves {analysis.speedup:.1f}× the throughput of the default config (1 worker, batch 1, eager)" in text
    report = markdown(analysis, s, trials, notes=["a note"], serve_command="servetune serve --ts-config x")
    assert "## Winner" in report and "headroom" in report and "`servetune serve --ts-config x`" in report
    assert "## Top 5" in report and "## Pareto front" in report and "- a note" in report


def test_report_says_when_no_config_meets_the_sla() -> None:
    s = study(family(workers=(1, 2), batch=(1, 4), delays=(10,)), p99_ms=50)
    analysis = analyse(s, drive(s, cost_model()))
    assert analysis.winner is None and analysis.closest is not None
    text = headline(analysis, s)
    assert text.startswith("No config meets the SLA (P99 <= 50 ms) on this hardware. Closest: eager on cpu,")
    assert "missed by" in text


def test_pareto_front_keeps_only_undominated_configs() -> None:
    s = study(family(workers=(1, 2, 3), batch=(1, 4, 16), delays=(10,)), strategy="grid", remeasure=0)
    analysis = analyse(s, drive(s, cost_model()))
    front = pareto_front(analysis.summaries)
    for point in front:
        p99 = point.latency() or 0
        assert not any((o.latency() or 0) < p99 and o.throughput_rps > point.throughput_rps for o in analysis.summaries)
    assert [p.latency() for p in front] == sorted(p.latency() or 0 for p in front)
    assert Config("eager/cpu", 3, 16, 10) not in [p.config for p in front]  # 2 workers do as much, sooner


def test_plots_are_written(tmp_path: Path) -> None:
    s = study(family(workers=(1, 2, 3), batch=(1, 4, 16), delays=(10,)), family("bf16/cpu"), strategy="grid")
    analysis = analyse(s, drive(s, cost_model()))
    written = write_plots(analysis, s, tmp_path)
    assert [p.name for p in written] == ["throughput_vs_p99.png", "heatmap-eager-cpu.png", "heatmap-bf16-cpu.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


def test_checkpoint_round_trip_resume_and_fresh_start(tmp_path: Path) -> None:
    s = study(family(workers=(1, 2), batch=(1, 4), delays=(10,)), strategy="grid", remeasure=0)
    trials = drive(s, cost_model())
    path = tmp_path / "trials.jsonl"
    checkpoint = Checkpoint(path, "abc")
    assert checkpoint.load() == []
    checkpoint.rewrite([])
    for trial in trials:
        checkpoint.append(trial)
    again = Checkpoint(path, "abc").load()
    assert [t.to_dict() for t in again] == [t.to_dict() for t in trials]
    with path.open("a") as handle:
        handle.write('{"index": 9, "config": {')  # a crash in the middle of a line
    damaged = Checkpoint(path, "abc")
    assert len(damaged.load()) == len(trials) and damaged.note is not None and "incomplete" in damaged.note
    changed = Checkpoint(path, "another")
    assert changed.load() == [] and changed.note is not None and "starting fresh" in changed.note
    assert not path.exists() and len(list(tmp_path.glob("trials.*.stale.jsonl"))) == 1
    header = json.loads((next(tmp_path.glob("*.stale.jsonl"))).read_text().splitlines()[0])
    assert header["fingerprint"] == "abc"


def test_plots_are_legible_at_their_size() -> None:
    """Every title and axis label (the colour bar's too) lies inside its figure, and cells keep three significant
    digits: 3.5 and 2.6 req/s do not both print "3"."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def figure(size: tuple[float, float]) -> tuple[object, object]:
        fig = Figure(figsize=size, layout="constrained")
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()

    s = study(family(workers=(1, 2), batch=(1,), delays=(10,)), strategy="grid", remeasure=0)
    analysis = analyse(s, drive(s, lambda c: (3.5 if c.workers == 1 else 2.6, 100.0)))
    plots = dict(figures(analysis, s, figure))  # type: ignore[arg-type]
    for name, fig in plots.items():
        assert fits(fig) == [], name
    cells = [t.get_text() for t in plots["heatmap-eager-cpu.png"].axes[0].texts]
    assert sorted(cells) == ["2.60", "3.50"]
    assert [number(v) for v in (3.5, 47.23, 120.4, 0.0123)] == ["3.50", "47.2", "120", "0.0123"]


def test_workers_that_did_not_take_the_config_are_named() -> None:
    from servetune.tune.runner import placement_problems

    config = Config("eager/cpu", 2, 1, 10, threads=1, pinning=True)
    good = ({"numThreads": 1, "cpuCores": [0]}, {"numThreads": 1, "cpuCores": [1]})
    assert placement_problems(config, good) == ""
    assert "numThreads=['2'] (asked 1)" in placement_problems(config, ({"numThreads": 2, "cpuCores": [0]},))
    assert "cpuCores overlap" in placement_problems(config, ({"numThreads": 1, "cpuCores": [0]},) * 2)
    old_server = ({"pid": 1},)  # a server that reports neither: it cannot be checked, and says why
    assert "numThreads not reported" in placement_problems(config, old_server)
    assert "does not support cpuPinning" in placement_problems(config, old_server)
    assert placement_problems(Config("eager/cpu", 1, 1, 10), old_server) == ""  # nothing asked, nothing to check
