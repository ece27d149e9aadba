"""The study's plots (PNG): throughput against P99 with the SLA line and the Pareto front; a heatmap of workers x
batch size per family (in an app, per model, of the app's throughput); and, for an app's pipeline, where the time
of a request goes, stage by stage, for the winner, the default config and the runners-up.

matplotlib is an optional extra (``servetune[plot]``); the Agg canvas is used directly, no pyplot state. Every text
is checked to fit its figure (``fits``), and numbers keep three significant digits (3.5 and 2.6 req/s do not both
print "3").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servetune.tune.analysis import Analysis
from servetune.tune.archives import slug
from servetune.tune.study import Family, Study
from servetune.tune.trial import Summary

log = logging.getLogger("servetune.tune")
Figure = Callable[[tuple[float, float]], tuple[Any, Any]]


def number(value: float) -> str:
    """Three significant digits, no exponent below a million: 3.5, 47.2, 120, 2610."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


def write_plots(analysis: Analysis, study: Study, out_dir: Path) -> list[Path]:
    """Write every plot; an empty list (and a log line) when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure as MplFigure
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'servetune[plot]'): no plots")
        return []

    def figure(size: tuple[float, float]) -> tuple[Any, Any]:
        fig = MplFigure(figsize=size, layout="constrained")
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()

    written = []
    for name, fig in figures(analysis, study, figure):
        path = out_dir / name
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def figures(analysis: Analysis, study: Study, figure: Figure) -> list[tuple[str, Any]]:
    """Every plot of the study, by file name."""
    out = [("throughput_vs_p99.png", _scatter(analysis, study, figure))]
    for i, name in enumerate(study.model_names):
        for family in study.families_of(name):
            if (fig := _heatmap(analysis, study, i, family, figure)) is not None:
                out.append((f"heatmap-{slug(family.label)}.png", fig))
    if study.pipeline and (fig := _stages(analysis, study, figure)) is not None:
        out.append(("stages.png", fig))
    return out


def _scatter(analysis: Analysis, study: Study, figure: Figure) -> Any:
    fig, ax = figure((9, 6))
    groups: dict[str, list[Summary]] = {}
    for s in analysis.summaries:
        if s.figures is not None:
            groups.setdefault(" + ".join(part.family for part in s.config.parts), []).append(s)
    for label, mine in groups.items():
        for passed, marker in ((True, "o"), (False, "x")):
            points = [s for s in mine if s.verdict.passed is passed]
            if points:
                ax.scatter(
                    [s.latency("p99_ms") for s in points],
                    [s.throughput_rps for s in points],
                    marker=marker,
                    label=f"{label} ({'meets' if passed else 'misses'} SLA)",
                )
    front = analysis.pareto
    if front:
        ax.plot([s.latency("p99_ms") for s in front], [s.throughput_rps for s in front], "k--", lw=1,
                drawstyle="steps-post", label="Pareto front")  # fmt: skip
    if study.sla.p99_ms is not None:
        ax.axvline(study.sla.p99_ms, color="red", lw=1.5, label=f"SLA: P99 {study.sla.p99_ms:g} ms")
    marked = [(analysis.winner, "winner"), (analysis.baseline, "default"), *((s, f"reference: {label}")
              for label, s in analysis.references)]  # fmt: skip
    for summary, text in marked:
        if summary is not None and summary.figures is not None:
            ax.annotate(text, (summary.latency("p99_ms"), summary.throughput_rps), textcoords="offset points",
                        xytext=(6, 6), fontsize=9, weight="bold")  # fmt: skip
    ax.set_xlabel("P99 latency, end to end (ms)" if study.pipeline else "P99 latency (ms)")
    ax.set_ylabel("throughput (req/s)")
    ax.set_title(f"{study.model}: throughput vs P99, one point per config")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _heatmap(analysis: Analysis, study: Study, part: int, family: Family, figure: Figure) -> Any | None:
    """Workers x batch size of one family: the best throughput meeting the SLA over every other knob (in an app,
    the app's throughput over the other models' knobs)."""
    rows, cols = family.workers, family.batch_sizes
    best: dict[tuple[int, int], tuple[float, bool]] = {}
    for s in analysis.summaries:
        config = s.config.parts[part]
        if config.family != family.label or s.figures is None:
            continue
        cell = (config.workers, config.batch_size)
        value = (s.throughput_rps, s.verdict.passed)
        if cell not in best or (value[1], value[0]) > (best[cell][1], best[cell][0]):
            best[cell] = value
    if not best:
        return None
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    grid = np.full((len(rows), len(cols)), np.nan)
    for (w, b), (rps, passed) in best.items():
        grid[rows.index(w), cols.index(b)] = rps if passed else np.nan
    fig, ax = figure((max(5.5, 2.6 + 0.9 * len(cols)), max(3.6, 1.8 + 0.55 * len(rows))))
    cmap = colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto", origin="lower")
    for (w, b), (_, passed) in best.items():
        if not passed:
            ax.add_patch(Rectangle((cols.index(b) - 0.5, rows.index(w) - 0.5), 1, 1, color="0.85"))
    fig.colorbar(image, ax=ax, label="req/s meeting SLA" if not study.is_app else "app req/s meeting SLA")
    top = np.nanmax(grid) if np.isfinite(grid).any() else 0.0
    for (w, b), (rps, passed) in best.items():
        light = passed and rps < 0.6 * top  # dark cells get white text, bright (yellow) cells black
        ax.text(cols.index(b), rows.index(w), number(rps) if passed else "miss", ha="center", va="center",
                color=("white" if light else "black") if passed else "firebrick", fontsize=9)  # fmt: skip
    ax.set_xticks(range(len(cols)), [str(b) for b in cols])
    ax.set_yticks(range(len(rows)), [str(w) for w in rows])
    ax.set_xlabel("batch size")
    ax.set_ylabel("workers")
    ax.set_title(f"{family.label}\nbest over the other knobs (grey: misses the SLA; blank: not measured)", fontsize=10)
    return fig


def _stages(analysis: Analysis, study: Study, figure: Figure) -> Any | None:
    """Stacked bars: for a few configs, the mean time a pipeline spends queued and computing at each stage, and
    between stages (the client's hooks and the network)."""
    chosen: list[tuple[str, Summary]] = []
    for label, summary in (("winner", analysis.winner), ("default", analysis.baseline)):
        if summary is not None:
            chosen.append((label, summary))
    for i, summary in enumerate(analysis.top(4)):
        if all(summary.config != s.config for _, s in chosen):
            chosen.append((f"#{i + 1}", summary))
    bars = []
    for label, summary in chosen:
        trial = next((t for t in reversed(summary.trials) if t.result is not None and t.result.stages), None)
        if trial is None or trial.result is None or trial.result.latency is None:
            continue
        parts: list[tuple[str, float]] = []
        for name, stage in trial.result.stages.items():
            srv = stage.server
            queue = srv.queue.mean_ms if srv and srv.queue else 0.0
            handler = srv.handler.mean_ms if srv and srv.handler else 0.0
            total = stage.latency.mean_ms if stage.latency else 0.0
            parts += [(f"{name} queue", queue), (f"{name} compute", handler),
                      (f"{name} other", max(0.0, total - queue - handler))]  # fmt: skip
        stage_sum = sum(s.latency.mean_ms for s in trial.result.stages.values() if s.latency)
        parts.append(("between stages", max(0.0, trial.result.latency.mean_ms - stage_sum)))
        bars.append((f"{label}: {number(summary.throughput_rps)} req/s", parts))
    if not bars:
        return None
    fig, ax = figure((10, 1.6 + 0.6 * len(bars)))
    from matplotlib import colormaps

    colours: dict[str, Any] = {}
    palette = iter(colormaps["tab20"].colors)  # type: ignore[attr-defined]
    for y, (_, parts) in enumerate(bars):
        left = 0.0
        for name, width in parts:
            if name not in colours:
                colours[name] = next(palette)
            ax.barh(y, width, left=left, color=colours[name], label=name if y == 0 else None)
            left += width
    ax.set_yticks(range(len(bars)), [label for label, _ in bars])
    ax.invert_yaxis()
    ax.set_xlabel("mean time per pipeline (ms)")
    ax.set_title(f"{study.model}: where a request's time goes, stage by stage", fontsize=10)
    fig.legend(fontsize=7, ncol=4, loc="outside lower center")
    return fig


def fits(fig: Any) -> list[str]:
    """The texts of ``fig`` (titles, labels, colour-bar labels) that are drawn partly outside it."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for ax in fig.axes:
        for text in (ax.title, ax.xaxis.label, ax.yaxis.label):
            if text.get_text():
                e = text.get_window_extent(renderer)
                if e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1 or e.y0 < box.y0 - 1 or e.y1 > box.y1 + 1:
                    out.append(text.get_text())
    return out
