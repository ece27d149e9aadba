"""The study's reports: ``trials.csv`` (TorchServe's ab_report columns, the bench layer's, then the tuner's) and
``report.md`` (the answer first, then the evidence)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from servetune.bench.report import TORCHSERVE_COLUMNS, csv_row
from servetune.tune.analysis import Analysis
from servetune.tune.study import Config, Study
from servetune.tune.trial import Summary, Trial, judge

TUNE_COLUMNS = (
    "Trial", "Repeat", "Family", "Optimization", "Device", "Load", "Capacity rate", "Objective", "SLA", "SLA pass",
    "SLA miss", "Worker memory MB", "Status", "Error", "Setup s", "Wall s", "Reason",
)  # fmt: skip


def describe(config: Config, study: Study) -> str:
    family = study.family(config.family)
    held = family.ongoing_batches
    return (
        f"{family.optimization} on {family.device}, {config.workers} worker{'s' if config.workers > 1 else ''}, "
        f"batch {config.batch_size}, delay {config.batch_delay_ms} ms"
        + ("" if held is None else f", replicas hold {held} batch{'es' if held > 1 else ''}")
    )


def trial_row(trial: Trial, study: Study) -> dict[str, Any]:
    family = study.family(trial.config.family)
    if trial.result is not None:
        row = csv_row(trial.result)
    else:
        row = dict.fromkeys(TORCHSERVE_COLUMNS, "")
        row.update({"Batch size": trial.config.batch_size, "Batch delay": trial.config.batch_delay_ms,
                    "Workers": trial.config.workers, "Model": study.model})  # fmt: skip
    verdict = judge(trial.figures(), trial.config, study)
    row.update({
        "Trial": trial.index,
        "Repeat": trial.repeat,
        "Family": trial.config.family,
        "Optimization": family.optimization,
        "Device": family.device,
        "Load": " ".join(f"{k}={v}" for k, v in trial.load.items()),
        "Capacity rate": "" if trial.capacity_rps is None else round(trial.capacity_rps, 2),
        "Objective": round(verdict.objective, 4),
        "SLA": study.sla.describe(),
        "SLA pass": "pass" if verdict.passed else "fail",
        "SLA miss": verdict.reason,
        "Worker memory MB": round(trial.memory_bytes / 2**20, 1) if trial.memory_bytes else "",
        "GPU memory MB": round(trial.gpu_memory_bytes / 2**20, 1) if trial.gpu_memory_bytes else "",
        "Status": trial.status,
        "Error": trial.error,
        "Setup s": trial.setup_s,
        "Wall s": trial.wall_s,
        "Reason": trial.reason,
    })  # fmt: skip
    return row


def write_trials_csv(trials: list[Trial], study: Study, path: Path) -> Path:
    rows = [trial_row(t, study) for t in trials]
    header = list(TORCHSERVE_COLUMNS)
    for row in rows:
        header += [key for key in row if key not in header and key not in TUNE_COLUMNS]
    header += TUNE_COLUMNS
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _p(summary: Summary, key: str = "p99_ms") -> str:
    value = summary.latency(key)
    return "n/a" if value is None else f"{value:.1f} ms"


def headline(analysis: Analysis, study: Study) -> str:
    """The answer in one or two sentences."""
    winner, baseline = analysis.winner, analysis.baseline
    if winner is None:
        closest = analysis.closest
        text = f"No config meets the SLA ({study.sla.describe()})."
        if closest is not None:
            text += (
                f" Closest: {describe(closest.config, study)}, {closest.verdict.reason} "
                f"(missed by {100 * closest.verdict.violation:.0f}%)."
            )
        return text
    text = f"{describe(winner.config, study)}: {winner.throughput_rps:.1f} req/s at P99 {_p(winner)}"
    if analysis.speedup is not None and baseline is not None:
        text += (
            f". It serves {analysis.speedup:.1f}× the throughput of the default config (1 worker, batch 1, eager) "
            f"at P99 {_p(winner)} (default: {baseline.throughput_rps:.1f} req/s at P99 {_p(baseline)}"
            f"{'' if baseline.verdict.passed else ', missing the SLA'})"
        )
    return text + "."


def _table(summaries: list[Summary], study: Study) -> list[str]:
    lines = [
        "| config | throughput | P50 | P99 | errors | memory | SLA | trials |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        errors = f"{100 * s.figures.error_rate:.2f}%" if s.figures else s.error or "n/a"
        memory = f"{s.memory_bytes / 2**20:.0f} MB" if s.memory_bytes else ""
        if s.gpu_memory_bytes:
            memory += f" + {s.gpu_memory_bytes / 2**20:.0f} MB GPU"
        verdict = "pass" if s.verdict.passed else f"fail: {s.verdict.reason}"
        lines.append(
            f"| {describe(s.config, study)} | {s.throughput_rps:.1f} req/s | {_p(s, 'p50_ms')} | {_p(s)} | "
            f"{errors} | {memory} | {verdict} | {len(s.trials)} |"
        )
    return lines


def markdown(
    analysis: Analysis,
    study: Study,
    trials: list[Trial],
    *,
    notes: list[str],
    serve_command: str | None = None,
    ray_serve_config: Path | None = None,
    plots: list[str] | None = None,
) -> str:
    lines = [f"# Tuning {study.model}", "", headline(analysis, study), ""]
    winner = analysis.winner
    if winner is not None:
        margins = [
            f"{key.removesuffix('_ms').upper()} {value:.1f} ms of {limit:g} ms "
            f"({100 * (1 - value / limit):.0f}% headroom)"
            for key, limit in study.sla.limits()
            if (value := winner.latency(key)) is not None
        ]
        lines += ["## Winner", "", f"- config: {describe(winner.config, study)}",
                  f"- objective: {study.objective.describe(winner.verdict.objective)}"]  # fmt: skip
        lines += [f"- margin to the SLA: {'; '.join(margins)}"] if margins else []
        if serve_command:
            lines += [f"- deploy: `{serve_command}` (files in `deploy/`)"]
        if ray_serve_config is not None:
            lines += [
                f"- or on a running Ray cluster: `serve deploy {ray_serve_config}` (also KubeRay's serveConfigV2)"
            ]
        lines.append("")
    lines += [
        "## Study",
        "",
        f"- SLA: {study.sla.describe()}; objective: {study.objective.kind}; strategy: {study.strategy.name}"
        + (f"; server: Ray Serve ({study.ray_address or 'a local Ray instance'})" if study.backend == "ray" else ""),
        f"- space: {len(study.families)} famil{'y' if len(study.families) == 1 else 'ies'} "
        f"({', '.join(f.label for f in study.families)}), {study.size} configs; "
        f"{len({t.config for t in trials})} configs measured in {len(trials)} trials",
        "",
        "## Top 5" if winner else "## Closest configs",
        "",
        *_table(analysis.top(), study),
        "",
        "## Pareto front (throughput vs P99)",
        "",
        *_table(analysis.pareto, study),
        "",
    ]
    if plots:
        lines += ["## Plots", "", *[f"![{name}]({name})" for name in plots], ""]
    if notes:
        lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    return "\n".join(lines)
