"""The study's reports: ``trials.csv`` (TorchServe's ab_report columns, the bench layer's, then the tuner's) and
``report.md`` (the answer first, then the evidence). In an app study every figure is the app's (end to end in a
pipeline) and each model's own figures (its stage) stand beside it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from servetune.bench.report import TORCHSERVE_COLUMNS, csv_row
from servetune.tune import finalists as final
from servetune.tune.analysis import Analysis
from servetune.tune.study import Config, Point, Study
from servetune.tune.targets import target_kind
from servetune.tune.trial import Summary, Trial, judge

TUNE_COLUMNS = (
    "Trial", "Repeat", "Family", "Optimization", "Device", "Threads", "Inter-op threads", "Pinning", "Load",
    "Capacity rate", "Objective", "SLA", "SLA pass", "SLA miss", "Worker memory MB", "Status", "Error", "Setup s",
    "Wall s", "Reason", "Phase", "Interference", "Runs measured again",
)  # fmt: skip


def describe(point: Point, study: Study) -> str:
    """A config for people: "eager on cpu, 2 workers, batch 4, delay 50 ms", each model's in an app."""
    if study.is_app:
        pairs = zip(study.model_names, point.parts, strict=True)
        return "; ".join(f"{name}: {describe_part(part, study)}" for name, part in pairs)
    return describe_part(point.parts[0], study)


def describe_part(config: Config, study: Study) -> str:
    family = study.family(config.family)
    text = (
        f"{family.optimization} on {family.device}, {config.workers} worker{'s' if config.workers > 1 else ''}, "
        f"batch {config.batch_size}, delay {config.batch_delay_ms} ms"
    )
    if config.threads:
        text += f", {config.threads} thread{'s' if config.threads > 1 else ''} each"
    if config.inter_op_threads:
        text += f", {config.inter_op_threads} inter-op"
    if config.pinning:
        text += ", pinned"
    return text + target_kind(study.backend).describe(family)


def _joined(point: Point, attr: str) -> str:
    return "/".join(str(getattr(part, attr)) for part in point.parts)


def trial_row(trial: Trial, study: Study) -> dict[str, Any]:
    point = trial.config
    families = [study.family(part.family) for part in point.parts]
    if trial.result is not None:
        row = csv_row(trial.result)
    else:
        row = dict.fromkeys(TORCHSERVE_COLUMNS, "")
        row["Model"] = study.model
    if study.is_app or trial.result is None:
        row.update({"Batch size": _joined(point, "batch_size"), "Batch delay": _joined(point, "batch_delay_ms"),
                    "Workers": _joined(point, "workers")})  # fmt: skip
    for name, stage in trial.result.stages.items() if trial.result is not None else ():
        lat = stage.latency
        row[f"{name} throughput"] = round(stage.throughput_rps, 2)
        row[f"{name} P50"] = round(lat.p50_ms, 3) if lat else ""
        row[f"{name} P99"] = round(lat.p99_ms, 3) if lat else ""
        queue = stage.server.queue if stage.server else None
        handler = stage.server.handler if stage.server else None
        row[f"{name} queue mean"] = round(queue.mean_ms, 3) if queue else ""
        row[f"{name} handler mean"] = round(handler.mean_ms, 3) if handler else ""
    verdict = judge(trial.figures(), trial.config, study)
    row.update({
        "Trial": trial.index,
        "Repeat": trial.repeat,
        "Family": " + ".join(part.family for part in point.parts),
        "Optimization": "/".join(f.optimization for f in families),
        "Device": "/".join(f.device for f in families),
        "Threads": _joined(point, "threads"),
        "Inter-op threads": _joined(point, "inter_op_threads"),
        "Pinning": "/".join("yes" if part.pinning else "no" for part in point.parts),
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
        "Phase": trial.phase,
        "Interference": trial.interference(),
        "Runs measured again": trial.remeasured,
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
        text = f"No config meets the SLA ({study.sla.describe()}) on this hardware."
        if closest is not None:
            text += (
                f" Closest: {describe(closest.config, study)}, {closest.verdict.reason} "
                f"(missed by {100 * closest.verdict.violation:.0f}%)."
            )
        return text
    text = f"{describe(winner.config, study)}: {winner.throughput_rps:.1f} req/s at P99 {_p(winner)}"
    if analysis.speedup is not None and baseline is not None:
        default = "each model: 1 worker, batch 1, eager" if study.is_app else "1 worker, batch 1, eager"
        text += (
            f". It serves {analysis.speedup:.1f}× the throughput of the default config ({default}) "
            f"at P99 {_p(winner)} (default: {baseline.throughput_rps:.1f} req/s at P99 {_p(baseline)}"
            f"{'' if baseline.verdict.passed else ', missing the SLA'})"
        )
    return text + "."


def finalist_lines(analysis: Analysis, study: Study) -> list[str]:
    """The finalists' pairwise comparisons and the choice they led to, as sentences."""
    verdict = analysis.finalists
    if verdict is None:
        return []
    lines = [final.sentence(c, lambda p: describe(p, study)) + "." for c in verdict.comparisons]
    if verdict.chosen is not None:
        lines.append(f"Chosen: {describe(verdict.chosen, study)}: {verdict.reason}.")
    else:
        lines.append(verdict.reason[:1].upper() + verdict.reason[1:] + ".")
    return lines


def online_lines(analysis: Analysis, study: Study) -> list[str]:
    """The winner against the online controller on the trace (``online.py``), as sentences."""
    verdict = analysis.online
    if verdict is None:
        return []
    lines = []
    for name, side in (("static winner", verdict.static), ("online controller", verdict.controller)):
        share = f"{100 * side.attainment:.2f}% of the trace inside the SLA" if side.attainment is not None else "n/a"
        p99 = f", P99 {side.p99_ms:.1f} ms" if side.p99_ms is not None else ""
        verdict_text = "meets the SLA" if side.passed else "misses the SLA"
        lines.append(f"{name[:1].upper() + name[1:]} ({side.rounds} rounds): {share}{p99} on the rounds' mean; "
                     f"{verdict_text}.")  # fmt: skip
    lines.append(verdict.sentence())
    chosen = "the online controller (switched on in deploy/)" if verdict.use_controller else "the static winner"
    lines.append(f"Deployed: {chosen}: {verdict.reason}.")
    return lines


def interference(summary: Summary) -> str:
    """The other processes' CPU during a config's kept runs (the most of any), and how many were contended."""
    hosts = [t.result.host for t in summary.trials if t.result is not None and t.result.host is not None]
    if not hosts:
        return ""
    worst = max(h.others_cores + (h.steal_cores or 0.0) for h in hosts)
    contended = sum(1 for t in summary.trials if t.contended)
    again = sum(t.remeasured for t in summary.trials)
    text = f"{worst:.2f} cores"
    if contended:
        text += f", {contended} of {len(summary.trials)} runs contended"
    if again:
        text += f", {again} measured again"
    return text


def _table(summaries: list[Summary], study: Study) -> list[str]:
    """One row per config; in an app, each model's P99 beside the app's (end to end in a pipeline)."""
    stages = study.model_names if study.is_app else ()
    head = ["config", "throughput", "P50", "P99", *(f"{name} P99" for name in stages), "errors", "memory", "SLA",
            "trials", "interference"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        errors = f"{100 * s.figures.error_rate:.2f}%" if s.figures else s.error or "n/a"
        memory = f"{s.memory_bytes / 2**20:.0f} MB" if s.memory_bytes else ""
        if s.gpu_memory_bytes:
            memory += f" + {s.gpu_memory_bytes / 2**20:.0f} MB GPU"
        verdict = "pass" if s.verdict.passed else f"fail: {s.verdict.reason}"
        own = [_stage(s, name, "p99_ms") for name in stages]
        cells = [describe(s.config, study), f"{s.throughput_rps:.1f} req/s", _p(s, "p50_ms"), _p(s), *own, errors,
                 memory, verdict, str(len(s.trials)), interference(s)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _stage(summary: Summary, name: str, key: str) -> str:
    stage = summary.figures.stages.get(name) if summary.figures else None
    return "n/a" if stage is None else f"{stage.latency[key]:.1f} ms"


def references(analysis: Analysis, study: Study) -> list[str]:
    """The study's references (configs measured beside the search), each against the winner."""
    stages = study.model_names if study.is_app else ()
    head = ["reference", "config", "throughput", "P50", "P99", *(f"{name} P99" for name in stages), "SLA",
            "the winner serves"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    winner = analysis.winner
    for label, s in analysis.references:
        verdict = "pass" if s.verdict.passed else f"fail: {s.verdict.reason}"
        ratio = f"{winner.throughput_rps / s.throughput_rps:.2f}×" if winner and s.throughput_rps > 0 else "n/a"
        cells = [label, describe(s.config, study), f"{s.throughput_rps:.2f} req/s", _p(s, "p50_ms"), _p(s),
                 *(_stage(s, name, "p99_ms") for name in stages), verdict, ratio]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def per_model(summary: Summary, study: Study) -> list[str]:
    """The winner of an app, model by model: its config, its stage's figures, and where its workers ran."""
    last = next((t for t in reversed(summary.trials) if t.result is not None), None)
    placed = last is not None and bool(last.placement)
    lines = ["| model | config | throughput | P50 | P99 | queue mean | handler mean | mean batch |"
             + (" workers (threads on cores) |" if placed else ""), "|---|---|---|---|---|---|---|---|"
             + ("---|" if placed else "")]  # fmt: skip
    for name, part in zip(study.model_names, summary.config.parts, strict=True):
        stage = last.result.stages.get(name) if last is not None and last.result is not None else None
        srv = stage.server if stage is not None else None
        figures = summary.figures.stages.get(name) if summary.figures else None
        workers = last.placement.get(name, ()) if last is not None else ()
        cores = ", ".join(f"{w.get('numThreads', '?')} thr on {w.get('cpuCores', 'any')}" for w in workers)
        lines.append(
            f"| {name} | {describe_part(part, study)} | "
            f"{figures.throughput_rps if figures else 0:.1f} req/s | {_stage(summary, name, 'p50_ms')} | "
            f"{_stage(summary, name, 'p99_ms')} | "
            f"{f'{srv.queue.mean_ms:.1f} ms' if srv and srv.queue else ''} | "
            f"{f'{srv.handler.mean_ms:.1f} ms' if srv and srv.handler else ''} | "
            f"{f'{srv.batch_size_mean:.2f}' if srv and srv.batch_size_mean is not None else ''} |"
            + (f" {cores} |" if placed else "")
        )
    return lines


def markdown(
    analysis: Analysis,
    study: Study,
    trials: list[Trial],
    *,
    notes: list[str],
    serve_command: str | None = None,
    alternatives: tuple[str, ...] = (),
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
        lines += [f"- or, {alternative}" for alternative in alternatives]
        lines.append("")
        if analysis.finalists is not None:
            lines += ["## Finalists", "", "Measured again, interleaved (A, B, A, B, ...), and compared round by round:",
                      "", *[f"- {line}" for line in finalist_lines(analysis, study)], ""]  # fmt: skip
        if analysis.online is not None:
            lines += ["## Static winner or online controller", "",
                      "The winner's archive with the online controller switched on (docs/controller.md: the study's "
                      "SLA, the searched ranges as its bounds, shedding on) replayed the same trace, interleaved with "
                      "the winner (static, controller, ...):",
                      "", *[f"- {line}" for line in online_lines(analysis, study)], ""]  # fmt: skip
        if study.is_app:
            load = "its pipeline (" + " -> ".join(st.model for st in study.pipeline) + ")" if study.pipeline else (
                "its mix (" + ", ".join(f"{name} {share:g}" for name, share in study.mix) + ")")  # fmt: skip
            lines += [f"Each model of the winner, loaded as the app loads it: {load}.", "",
                      *per_model(winner, study), ""]  # fmt: skip
    lines += [
        "## Study",
        "",
        f"- SLA: {study.sla.describe()}"
        + (
            " (sized on this machine: "
            + ", ".join(f"{m:g}x the single-request latency" for _, m in study.sla_scale)
            + "; see the notes)"
            if study.sla_scale
            else ""
        )
        + f"; objective: {study.objective.kind}; strategy: {study.strategy.name}"
        + (f"; server: {server}" if (server := target_kind(study.backend).describe_server(study)) else ""),
        f"- space: {len(study.families)} famil{'y' if len(study.families) == 1 else 'ies'} "
        f"({', '.join(f.label for f in study.families)}), {study.size} configs"
        + (f" (the product of {len(study.models)} models' spaces)" if study.is_app else "")
        + "; "
        f"{len({t.config for t in trials})} configs measured in {len(trials)} trials",
        "",
        "## Top 5" if winner else "## Closest configs",
        "",
        *_table(analysis.top(), study),
        "",
        "## Pareto front (throughput vs P99" + (" end to end)" if study.pipeline else ")"),
        "",
        *_table(analysis.pareto, study),
        "",
    ]
    if analysis.references:
        lines += ["## Beside the references", "", *references(analysis, study), ""]
    if plots:
        lines += ["## Plots", "", *[f"![{name}]({name})" for name in plots], ""]
    contended = [t for t in trials if t.contended]
    again = sum(t.remeasured for t in trials)
    if contended or again:
        notes = [*notes, f"interference: {again} load run(s) were measured again because other processes used the "
                 f"machine (or the client fell behind); {len(contended)} trial(s) kept figures measured under "
                 "contention (the 'interference' column says which)"]  # fmt: skip
    if notes:
        lines += ["## Notes", "", *[f"- {note}" for note in notes], ""]
    return "\n".join(lines)
