"""The latency plot (PNG): latency over the run (with each window's P99 and the SLO's deadline when one was given),
the load over the run (requests sent per second against the schedule), the latency histogram and the percentile
spectrum.

matplotlib is an optional extra (``servetune[plot]``) and is imported here only; the Agg canvas is used directly,
so nothing touches pyplot's global state or needs a display.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from servetune.bench.recording import UNKNOWN
from servetune.bench.result import BenchResult

log = logging.getLogger("servetune.bench")


def plot_latency(result: BenchResult, path: Path) -> Path | None:
    """Write the plot; returns None (and logs why) when matplotlib is missing or nothing succeeded."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'servetune[plot]'): no latency plot")
        return None
    rec = result.samples
    if rec is None or result.latency is None:
        return None
    status = np.frombuffer(rec.status, dtype=np.int32)
    ok = ((status >= 200) & (status < 300)) | (status == UNKNOWN)
    start = np.frombuffer(rec.start_s, dtype=np.float64)
    latency = np.frombuffer(rec.latency_ms, dtype=np.float64)

    fig = Figure(figsize=(11, 11), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(3, 2, height_ratios=(3, 2, 3))
    over_time = fig.add_subplot(grid[0, :])
    load = fig.add_subplot(grid[1, :], sharex=over_time)
    histogram, spectrum = fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1])
    fig.suptitle(f"{result.url} — {result.engine}, {result.mode} loop, {result.throughput_rps:.1f} req/s")

    sent_label = "intended send time (s)" if result.mode == "open" else "send time (s)"
    over_time.scatter(start[ok], latency[ok], s=2, alpha=0.5, label="succeeded")
    if (~ok).any():
        over_time.scatter(start[~ok], latency[~ok], s=4, color="tab:red", label="failed")
    if result.slo is not None:
        windows = result.slo.windows
        over_time.step([w.start_s for w in windows] + [windows[-1].start_s + result.slo.window_s] if windows else [],
                       [w.p99_ms or np.nan for w in windows] + [np.nan] if windows else [], where="post",
                       color="tab:green", label=f"P99 of each {result.slo.window_s:g} s window")  # fmt: skip
        over_time.axhline(result.slo.deadline_ms, color="tab:red", linestyle=":", label="SLO deadline")
    over_time.set(xlabel=sent_label, ylabel="latency (ms)", title="latency over the run")
    over_time.legend(loc="upper left")

    sent = np.frombuffer(rec.sent_s, dtype=np.float64)
    seconds = int(np.ceil(max(float(start.max()), float(sent.max()), result.duration_s))) if len(start) else 1
    edges = np.arange(seconds + 1, dtype=np.float64)
    load.stairs(np.histogram(sent, edges)[0], edges, label="sent")
    if result.mode == "open":
        load.stairs(np.histogram(start, edges)[0], edges, linestyle="--", label="scheduled")
    load.stairs(np.histogram((start + latency / 1e3)[ok], edges)[0], edges, alpha=0.6, label="answered (ok)")
    load.set(xlabel=sent_label, ylabel="requests per second", title="load over the run")
    load.legend(loc="upper left")

    good = np.sort(latency[ok])
    histogram.hist(good, bins=min(100, max(10, len(good) // 20)), color="tab:blue")
    histogram.set(xlabel="latency (ms)", ylabel="requests", title="distribution")
    lat = result.latency
    for value, name in ((lat.p50_ms, "P50"), (lat.p99_ms, "P99")):
        histogram.axvline(value, color="tab:orange", linestyle="--")
        histogram.annotate(name, (value, 0), textcoords="offset points", xytext=(3, 5))

    # Percentile spectrum on a 1/(1-q) axis, as HdrHistogram plots it: the tail gets the room it deserves.
    q = (np.arange(1, len(good) + 1) - 0.5) / len(good)
    spectrum.plot(1.0 / (1.0 - q), good)
    spectrum.set_xscale("log")
    spectrum.minorticks_off()
    ticks = [p for p in (50, 90, 99, 99.9, 99.99) if 1 / (1 - p / 100) <= len(good)]
    spectrum.set_xticks([1 / (1 - p / 100) for p in ticks], [f"{p:g}%" for p in ticks])
    spectrum.set(xlabel="percentile", ylabel="latency (ms)", title="percentile spectrum")
    if lat.p99_ci_low_ms is not None and lat.p99_ci_high_ms is not None:
        spectrum.axhspan(lat.p99_ci_low_ms, lat.p99_ci_high_ms, color="tab:orange", alpha=0.2, label="P99 95% CI")
        spectrum.legend(loc="upper left")
    fig.savefig(path, dpi=100)
    return path
