"""The study's plots (PNG): throughput against P99 with the SLA line and the Pareto front, and one heatmap of
workers x batch size per family (optimization/device).

matplotlib is an optional extra (``servetune[plot]``); the Agg canvas is used directly, no pyplot state.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from servetune.tune.analysis import Analysis
from servetune.tune.archives import slug
from servetune.tune.study import Study

log = logging.getLogger("servetune.tune")


def write_plots(analysis: Analysis, study: Study, out_dir: Path) -> list[Path]:
    """Write every plot; an empty list (and a log line) when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'servetune[plot]'): no plots")
        return []

    def figure(size: tuple[float, float]) -> tuple[Any, Any]:
        fig = Figure(figsize=size, layout="constrained")
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()

    written = [_scatter(analysis, study, out_dir / "throughput_vs_p99.png", figure)]
    for family in study.families:
        path = out_dir / f"heatmap-{slug(family.label)}.png"
        if _heatmap(analysis, study, family.label, path, figure):
            written.append(path)
    return written


def _scatter(analysis: Analysis, study: Study, path: Path, figure: Any) -> Path:
    fig, ax = figure((9, 6))
    for family in study.families:
        mine = [s for s in analysis.summaries if s.config.family == family.label and s.figures is not None]
        for passed, marker in ((True, "o"), (False, "x")):
            points = [s for s in mine if s.verdict.passed is passed]
            if points:
                ax.scatter(
                    [s.latency("p99_ms") for s in points],
                    [s.throughput_rps for s in points],
                    marker=marker,
                    label=f"{family.label} ({'meets' if passed else 'misses'} SLA)",
                )
    front = analysis.pareto
    if front:
        ax.plot([s.latency("p99_ms") for s in front], [s.throughput_rps for s in front], "k--", lw=1,
                drawstyle="steps-post", label="Pareto front")  # fmt: skip
    if study.sla.p99_ms is not None:
        ax.axvline(study.sla.p99_ms, color="red", lw=1.5, label=f"SLA: P99 {study.sla.p99_ms:g} ms")
    for summary, text in ((analysis.winner, "winner"), (analysis.baseline, "default")):
        if summary is not None and summary.figures is not None:
            ax.annotate(text, (summary.latency("p99_ms"), summary.throughput_rps), textcoords="offset points",
                        xytext=(6, 6), fontsize=9, weight="bold")  # fmt: skip
    ax.set_xlabel("P99 latency (ms)")
    ax.set_ylabel("throughput (req/s)")
    ax.set_title(f"{study.model}: throughput vs P99, one point per config")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def _heatmap(analysis: Analysis, study: Study, label: str, path: Path, figure: Any) -> bool:
    family = study.family(label)
    rows, cols = family.workers, family.batch_sizes
    best: dict[tuple[int, int], tuple[float, bool]] = {}
    for s in analysis.summaries:
        if s.config.family != label or s.figures is None:
            continue
        cell = (s.config.workers, s.config.batch_size)
        value = (s.throughput_rps, s.verdict.passed)
        if cell not in best or (value[1], value[0]) > (best[cell][1], best[cell][0]):
            best[cell] = value
    if not best:
        return False
    import numpy as np

    grid = np.full((len(rows), len(cols)), np.nan)
    for (w, b), (rps, passed) in best.items():
        grid[rows.index(w), cols.index(b)] = rps if passed else 0.0
    fig, ax = figure((1.2 + 0.9 * len(cols), 1.2 + 0.6 * len(rows)))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto", origin="lower")
    fig.colorbar(image, ax=ax, label="throughput meeting the SLA (req/s)")
    for (w, b), (rps, passed) in best.items():
        ax.text(cols.index(b), rows.index(w), f"{rps:.0f}" if passed else "miss", ha="center", va="center",
                color="white" if passed else "red", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(cols)), [str(b) for b in cols])
    ax.set_yticks(range(len(rows)), [str(w) for w in rows])
    ax.set_xlabel("batch size")
    ax.set_ylabel("workers")
    ax.set_title(f"{label}: best over batch delays (blank: not measured)")
    fig.savefig(path, dpi=110)
    return True
