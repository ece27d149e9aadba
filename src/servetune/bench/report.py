"""Reports of one run: result.json, ab_report.csv (TorchServe's columns first), report.md, samples.csv,
requests.jsonl, windows.csv (with an SLO), a plot, and the terminal summary."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from servetune.bench.result import BenchResult, Distribution

# TorchServe's benchmarks/utils/reporting.py writes these, in this order, to ab_report.csv.
TORCHSERVE_COLUMNS = (
    "Benchmark", "TS failed requests", "TS throughput", "TS latency P50", "TS latency P90", "TS latency P99",
    "TS latency mean", "TS error rate", "Batch size", "Batch delay", "Workers", "Model", "Concurrency", "Input",
    "Requests", "Model_p50", "Model_p90", "Model_p99", "Queue time p50", "Queue time p90", "Queue time p99",
    "predict_mean", "handler_time_mean", "waiting_time_mean", "worker_thread_mean", "cpu_percentage_mean",
    "memory_percentage_mean", "gpu_percentage_mean", "gpu_memory_percentage_mean", "gpu_memory_used_mean",
)  # fmt: skip


def _r(value: float | None, digits: int = 3) -> float | str:
    return "" if value is None else round(value, digits)


def _dist(dist: Distribution | None, attr: str) -> float | str:
    return "" if dist is None else _r(getattr(dist, attr))


def csv_row(result: BenchResult) -> dict[str, Any]:
    """One ab_report.csv row: every TorchServe column (blank where we measure nothing like it), then ours.

    Times are ms, the error rate is a percentage, as in TorchServe. Model_p* and predict_mean are the handler
    time (TorchServe's PredictionTime per batch, here per request); Queue time is the time before the batch left.
    """
    lat, srv, labels = result.latency, result.server, result.labels
    queue, handler = (srv.queue, srv.handler) if srv else (None, None)
    row: dict[str, Any] = dict.fromkeys(TORCHSERVE_COLUMNS, "")
    row.update({
        "Benchmark": "AB" if result.engine == "ab" else f"servetune {result.engine}",
        "TS failed requests": result.failed,
        "TS throughput": _r(result.throughput_rps, 2),
        "TS latency P50": _r(lat.p50_ms) if lat else "",
        "TS latency P90": _r(lat.p90_ms) if lat else "",
        "TS latency P99": _r(lat.p99_ms) if lat else "",
        "TS latency mean": _r(lat.mean_ms) if lat else "",
        "TS error rate": _r(100.0 * result.error_rate, 4),
        "Batch size": labels.get("batch_size", ""),
        "Batch delay": labels.get("batch_delay", ""),
        "Workers": labels.get("workers", ""),
        "Model": labels.get("model", ""),
        "Concurrency": result.concurrency if result.concurrency is not None else "",
        "Input": result.input or "",
        "Requests": result.sent,
        "Model_p50": _dist(handler, "p50_ms"),
        "Model_p90": _dist(handler, "p90_ms"),
        "Model_p99": _dist(handler, "p99_ms"),
        "Queue time p50": _dist(queue, "p50_ms"),
        "Queue time p90": _dist(queue, "p90_ms"),
        "Queue time p99": _dist(queue, "p99_ms"),
        "predict_mean": _dist(handler, "mean_ms"),
        "handler_time_mean": _dist(handler, "mean_ms"),
        "waiting_time_mean": _dist(queue, "mean_ms"),
    })  # fmt: skip
    row.update({
        "Engine": result.engine,
        "Mode": result.mode,
        "Rate": result.rate if result.rate is not None else "",
        "Arrival": result.arrival or "",
        "Duration s": _r(result.duration_s),
        "Succeeded": result.succeeded,
        "Errors": ";".join(f"{k}:{v}" for k, v in result.errors.items()),
        "TS latency P95": _r(lat.p95_ms) if lat else "",
        "TS latency P99.9": _r(lat.p999_ms) if lat else "",
        "TS latency min": _r(lat.min_ms) if lat else "",
        "TS latency max": _r(lat.max_ms) if lat else "",
        "TS latency P99 CI low": _r(lat.p99_ci_low_ms) if lat else "",
        "TS latency P99 CI high": _r(lat.p99_ci_high_ms) if lat else "",
        "Samples at or above P99": lat.at_or_above_p99 if lat else "",
        "Server breakdown": srv.source if srv else "",
        "Server time mean": _dist(srv.total if srv else None, "mean_ms"),
        "Mean batch size": _r(srv.batch_size_mean) if srv and srv.batch_size_mean is not None else "",
        "Client CPU %": _r(result.client.cpu_percent, 1),
        "Throughput CI low": _r(result.throughput_low_rps, 2),
        "Throughput CI high": _r(result.throughput_high_rps, 2),
        "TS latency P99 upper 95%": _r(lat.p99_upper_ms) if lat else "",
        "Schedule": result.schedule or "",
        "SLO": result.slo.slo.describe() if result.slo else "",
        "Goodput": _r(result.slo.goodput_rps, 2) if result.slo else "",
        "Attainment": _r(result.slo.attainment, 5) if result.slo else "",
        "Attainment low 95%": _r(result.slo.attainment_low, 5) if result.slo else "",
        "Windows inside SLO": f"{result.slo.windows_inside}/{len(result.slo.windows)}" if result.slo else "",
        "Slip p50 ms": _r(result.fidelity.slip_p50_ms, 4) if result.fidelity else "",
        "Slip p99 ms": _r(result.fidelity.slip_p99_ms, 4) if result.fidelity else "",
        "Per-second deviation": _r(result.fidelity.second_deviation, 5) if result.fidelity else "",
        "Other CPU cores": _r(result.host.others_cores) if result.host else "",
        "Steal cores": _r(result.host.steal_cores) if result.host else "",
        "Interrupt cores": _r(result.host.irq_cores) if result.host else "",
        "Contended": ("yes" if result.contended else "no") if result.host else "",
        "Late sends": result.late_sends,
        "Unreliable": "; ".join(result.reasons),
        "Started": result.started_at,
    })  # fmt: skip
    return row


def describe_load(result: BenchResult) -> str:
    if result.mode == "closed":
        return f"concurrency {result.concurrency}"
    if result.schedule:
        return f"schedule {result.schedule}"
    return f"{result.rate:g} req/s {result.arrival}"


def figure_rows(result: BenchResult) -> list[tuple[str, str]]:
    """The figures beyond latency that every report shows: throughput's interval, the SLO, fidelity, interference."""
    rows = []
    if result.throughput_low_rps is not None and result.throughput_high_rps is not None:
        rows.append(("throughput 95% CI", f"{result.throughput_low_rps:.2f}–{result.throughput_high_rps:.2f} req/s"))
    lat = result.latency
    if lat is not None:
        upper = f"{lat.p99_upper_ms:.2f} ms" if lat.p99_upper_ms is not None else "too few samples (< 299)"
        rows.append(("P99 upper bound (95%)", upper))
    if result.slo is not None:
        slo = result.slo
        rows += [
            ("SLO", f"{slo.slo.describe()} (a request is good within {slo.deadline_ms:g} ms)"),
            ("goodput", f"{slo.goodput_rps:.2f} req/s ({slo.good} good of {slo.sent})"),
            ("attainment", f"{100 * slo.attainment:.2f}% (95% lower bound {100 * slo.attainment_low:.2f}%)"),
            (f"{slo.window_s:g} s windows inside the SLO", f"{slo.windows_inside} of {len(slo.windows)}"
             + (f" ({100 * slo.windows_share:.0f}%)" if slo.windows else "")),
        ]  # fmt: skip
    if result.fidelity is not None:
        rows.append(("schedule kept", result.fidelity.describe()))
    if result.host is not None:
        rows.append(("machine CPU (cores)", result.host.describe()))
    return rows


def markdown(result: BenchResult) -> str:
    """A short human report."""
    lat, srv = result.latency, result.server
    load = describe_load(result)
    lines = [
        f"# Load run: {result.url}",
        "",
        f"{result.engine} engine, {result.mode} loop ({load}), "
        f"{result.sent} requests in {result.duration_s:.2f} s, started {result.started_at}.",
        "",
    ]
    if result.unreliable:
        lines += [f"**Unreliable:** {reason}" for reason in result.reasons] + [""]
    lines += [
        "| measure | value |",
        "|---|---|",
        f"| throughput | {result.throughput_rps:.2f} req/s |",
        f"| errors | {result.failed} ({100 * result.error_rate:.2f}%) {_errors(result)} |",
    ]
    if lat:
        ci = (
            f"{lat.p99_ci_low_ms:.2f}–{lat.p99_ci_high_ms:.2f} ms"
            if lat.p99_ci_low_ms is not None and lat.p99_ci_high_ms is not None
            else "too few samples"
        )
        lines += [
            f"| latency mean / min / max | {lat.mean_ms:.2f} / {lat.min_ms:.2f} / {lat.max_ms:.2f} ms |",
            f"| P50 / P90 / P95 | {lat.p50_ms:.2f} / {lat.p90_ms:.2f} / {lat.p95_ms:.2f} ms |",
            f"| P99 / P99.9 | {lat.p99_ms:.2f} / {lat.p999_ms:.2f} ms |",
            f"| P99 {lat.ci_confidence:.0%} CI | {ci} ({lat.at_or_above_p99} samples at or above P99) |",
        ]
    if srv:
        for name, dist in (("server queue", srv.queue), ("server handler", srv.handler), ("server total", srv.total)):
            if dist:
                lines.append(f"| {name} ({srv.source}) | {_describe(dist)} |")
        if srv.batch_size_mean is not None:
            lines.append(f"| mean batch size | {srv.batch_size_mean:.2f} |")
    lines.append(f"| client CPU | {result.client.cpu_percent:.0f}% of one core |")
    lines += [f"| {name} | {value} |" for name, value in figure_rows(result)]
    if result.mode == "open":
        late = f"{result.late_sends} of {result.sent} (worst {result.max_late_ms:.1f} ms)"
        lines.append(f"| late sends (> 1 ms) | {late} |")
    if result.stages:
        lines += ["", "Stages (each stage's calls; the figures above are the whole pipeline's):", ""]
        lines += ["| " + " | ".join(STAGE_COLUMNS) + " |", "|" + "---|" * len(STAGE_COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in stage_rows(result)]
    if result.warnings:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


STAGE_COLUMNS = ("stage", "calls", "req/s", "P50 ms", "P90 ms", "P99 ms", "queue mean ms", "handler mean ms",
                 "mean batch", "errors")  # fmt: skip


def stage_rows(result: BenchResult) -> list[tuple[str, ...]]:
    """One row per stage, then what the client spent between stages (hooks, network): the pipeline's mean latency
    less the stages' means."""
    rows = []
    for name, stage in result.stages.items():
        lat, srv = stage.latency, stage.server
        rows.append((
            name, str(stage.sent), f"{stage.throughput_rps:.2f}",
            *(f"{getattr(lat, k):.1f}" if lat else "n/a" for k in ("p50_ms", "p90_ms", "p99_ms")),
            f"{srv.queue.mean_ms:.1f}" if srv and srv.queue else "",
            f"{srv.handler.mean_ms:.1f}" if srv and srv.handler else "",
            f"{srv.batch_size_mean:.2f}" if srv and srv.batch_size_mean is not None else "",
            f"{stage.failed} {_errors(stage)}".strip(),
        ))  # fmt: skip
    if result.latency is not None and all(s.latency is not None for s in result.stages.values()):
        between = result.latency.mean_ms - sum(s.latency.mean_ms for s in result.stages.values() if s.latency)
        rows.append(("between stages (client)", "", "", f"mean {between:.1f}", "", "", "", "", "", ""))
    return rows


def _errors(result: BenchResult) -> str:
    return "(" + ", ".join(f"{k}: {v}" for k, v in result.errors.items()) + ")" if result.errors else ""


def _describe(dist: Distribution) -> str:
    text = f"mean {dist.mean_ms:.2f} ms"
    if dist.p50_ms is not None and dist.p99_ms is not None:
        text += f", P50 {dist.p50_ms:.2f}, P99 {dist.p99_ms:.2f} ms"
    return text


def write_samples(result: BenchResult, path: Path) -> None:
    rec = result.samples
    if rec is None:
        return
    columns = (rec.start_s, rec.latency_ms, rec.status, rec.queue_ms, rec.handler_ms, rec.batch_size)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("start_s", "latency_ms", "status", "queue_ms", "handler_ms", "batch_size"))
        for start, latency, status, queue, handler, batch in zip(*columns, strict=True):
            writer.writerow(
                (
                    f"{start:.6f}",
                    f"{latency:.3f}",
                    status,
                    "" if np.isnan(queue) else f"{queue:.3f}",
                    "" if np.isnan(handler) else f"{handler:.3f}",
                    batch or "",
                )
            )


def write_requests(result: BenchResult, path: Path) -> None:
    """``requests.jsonl``: one line per measured request, by intended send time: ``intended_s`` and ``sent_s`` (from
    the start of the measured part), ``latency_ms`` (from the intended time in the open loop), ``status``, and the
    server's ``queue_ms``, ``handler_ms``, ``batch_size`` (null when it did not say)."""
    rec = result.samples
    if rec is None:
        return
    order = np.argsort(np.frombuffer(rec.start_s, dtype=np.float64), kind="stable")
    with path.open("w") as handle:
        for i in order.tolist():
            queue, handler, batch = rec.queue_ms[i], rec.handler_ms[i], rec.batch_size[i]
            line = {
                "intended_s": round(rec.start_s[i], 6),
                "sent_s": round(rec.sent_s[i], 6),
                "latency_ms": round(rec.latency_ms[i], 3),
                "status": rec.status[i],
                "queue_ms": None if queue != queue else round(queue, 3),
                "handler_ms": None if handler != handler else round(handler, 3),
                "batch_size": batch or None,
            }
            handle.write(json.dumps(line) + "\n")


def write_windows(result: BenchResult, path: Path) -> None:
    """``windows.csv``: each window of the run against the SLO."""
    if result.slo is None:
        return
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("start_s", "sent", "succeeded", "good", "p99_ms", "inside_slo"))
        for w in result.slo.windows:
            p99 = "" if w.p99_ms is None else f"{w.p99_ms:.3f}"
            writer.writerow((f"{w.start_s:g}", w.sent, w.succeeded, w.good, p99, "yes" if w.inside else "no"))


def write_report(result: BenchResult, out_dir: Path) -> list[Path]:
    """Write result.json, ab_report.csv, report.md, samples.csv, requests.jsonl, windows.csv (with an SLO) and
    latency.png (when matplotlib is installed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "result.json", out_dir / "ab_report.csv", out_dir / "report.md"]
    written[0].write_text(result.to_json() + "\n")
    row = csv_row(result)
    if result.stages:
        row["Model"] = "pipeline: " + " -> ".join(result.stages)
    rows = [row, *(csv_row(stage) for stage in result.stages.values())]
    with written[1].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        writer.writeheader()
        writer.writerows(rows)
    written[2].write_text(markdown(result))
    if result.slo is not None:
        write_windows(result, out_dir / "windows.csv")
        written.append(out_dir / "windows.csv")
    if result.samples is not None:
        write_samples(result, out_dir / "samples.csv")
        write_requests(result, out_dir / "requests.jsonl")
        written += [out_dir / "samples.csv", out_dir / "requests.jsonl"]
        from servetune.bench.plot import plot_latency

        png = plot_latency(result, out_dir / "latency.png")
        if png is not None:
            written.append(png)
    return written


def print_summary(result: BenchResult, console: Any = None) -> None:
    """The terminal summary (rich): the same figures as report.md."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    lat, srv = result.latency, result.server
    load = describe_load(result)
    table = Table(title=result.url, show_header=False)
    table.add_column("measure", style="bold")
    table.add_column("value")
    table.add_row("load", f"{result.engine} engine, {result.mode} loop, {load}")
    table.add_row("requests", f"{result.sent} in {result.duration_s:.2f} s")
    table.add_row("throughput", f"{result.throughput_rps:.2f} req/s")
    table.add_row("errors", f"{result.failed} ({100 * result.error_rate:.2f}%) {_errors(result)}")
    if lat:
        ci = (
            f"[{lat.p99_ci_low_ms:.2f}, {lat.p99_ci_high_ms:.2f}]"
            if lat.p99_ci_low_ms is not None and lat.p99_ci_high_ms is not None
            else "n/a (too few samples)"
        )
        table.add_row("latency mean/min/max", f"{lat.mean_ms:.2f} / {lat.min_ms:.2f} / {lat.max_ms:.2f} ms")
        table.add_row("P50 / P90 / P95", f"{lat.p50_ms:.2f} / {lat.p90_ms:.2f} / {lat.p95_ms:.2f} ms")
        table.add_row("P99 / P99.9", f"{lat.p99_ms:.2f} / {lat.p999_ms:.2f} ms")
        table.add_row(f"P99 {lat.ci_confidence:.0%} CI", f"{ci} ms, {lat.at_or_above_p99} samples >= P99")
    if srv:
        for name, dist in (("server queue", srv.queue), ("server handler", srv.handler), ("server total", srv.total)):
            if dist:
                table.add_row(f"{name} ({srv.source})", _describe(dist))
        if srv.batch_size_mean is not None:
            table.add_row("mean batch size", f"{srv.batch_size_mean:.2f}")
    table.add_row("client CPU", f"{result.client.cpu_percent:.0f}% of one core")
    for name, value in figure_rows(result):
        table.add_row(name, value)
    if result.mode == "open":
        late = f"{result.late_sends} of {result.sent} ({100 * result.late_sends / max(1, result.sent):.1f}%)"
        table.add_row("late sends (> 1 ms)", f"{late}, worst {result.max_late_ms:.1f} ms")
    console.print(table)
    if result.stages:
        stages = Table(title="stages", show_header=True)
        for column in STAGE_COLUMNS:
            stages.add_column(column)
        for stage_row in stage_rows(result):
            stages.add_row(*stage_row)
        console.print(stages)
    for reason in result.reasons:
        console.print(f"[bold red]unreliable:[/] {reason}")
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
