"""The variant table (rich) and its JSON form."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from servetune.optimize.measure import VariantResult
from servetune.optimize.parity import ParityReport


def parity_cell(report: ParityReport | None) -> str:
    if report is None:
        return "-"
    parts = []
    if report.max_abs is not None:
        parts.append(f"abs {report.max_abs:.2g} rel {report.max_rel or 0.0:.2g}")
    if report.top1_agreement is not None:
        parts.append(f"top1 {report.top1_agreement:.0%}")
    if report.match is not None:
        parts.append(f"match {report.match:.0%}")
    if report.box_iou is not None:
        parts.append(f"IoU {report.box_iou:.3f} score {report.score_diff or 0.0:.2g}")
    return ", ".join(parts) or "no outputs compared"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def variant_table(results: Sequence[VariantResult], batch_sizes: Sequence[int], title: str | None = None) -> Table:
    """One row per variant; latency cells carry the speed ratio to eager (measured in the same run)."""
    eager = next((r for r in results if r.variant == "eager" and r.status == "ok"), None)
    table = Table(title=title, show_lines=True)
    table.add_column("variant", style="bold", no_wrap=True)
    table.add_column("applies")
    table.add_column("parity vs eager", min_width=18)
    table.add_column("convert s", justify="right")
    for batch in batch_sizes:
        table.add_column(f"b{batch} ms (x eager)", justify="right")
    table.add_column("peak MiB", justify="right")
    table.add_column("size MiB", justify="right")
    for result in results:
        if result.status == "ok":
            applies = "yes" + ("\n" + "; ".join(result.notes) if result.notes else "")
        elif result.status == "parity":
            applies = f"[red]rejected[/red]: {result.reason}"
        else:
            applies = f"[yellow]no[/yellow]: {result.reason}"
        cells = []
        for batch in batch_sizes:
            latency = result.latency_ms.get(batch)
            ratio = result.speedup(eager, batch) if eager is not None else None
            cells.append("-" if latency is None else f"{latency:.3g}" + (f" ({ratio:.2f}x)" if ratio else ""))
        table.add_row(
            result.variant,
            applies,
            parity_cell(result.parity),
            _number(result.convert_s),
            *cells,
            _number(result.peak_mib),
            _number(result.artifact_mib),
        )
    return table


def results_json(results: Sequence[VariantResult]) -> list[dict[str, Any]]:
    """The results as JSON-ready dicts (parity reports included, tolerances as dicts)."""
    return [dataclasses.asdict(result) for result in results]
