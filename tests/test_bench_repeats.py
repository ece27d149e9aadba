"""Figures over repeated runs: mean, median and tail, and a verdict that says "no verdict" when runs disagree."""

from __future__ import annotations

import pytest

from servetune.bench.repeats import spread, verdict


def test_spread_reports_mean_median_and_the_worst_run() -> None:
    ratios = spread([1.98, 0.40, 1.49])  # serve_overhead.py's three runs of served/bare in the issue
    assert ratios.mean == pytest.approx(1.29) and ratios.median == 1.49 and ratios.tail == 0.40
    assert ratios.ratio == pytest.approx(1.98 / 0.40)
    assert "mean 1.29, median 1.49, tail 0.40 (min-max 0.40-1.98, 3 runs)" == ratios.describe()
    latency = spread([1.2, 2.5, 1.1], higher_is_better=False)
    assert latency.tail == 2.5


def test_a_verdict_needs_the_runs_to_agree() -> None:
    assert verdict([1.98, 0.40, 1.49], 0.95) == "no verdict (the runs disagree: 2 of 3 meet the target)"
    assert verdict([0.97, 0.99, 1.02], 0.95) == "met"
    assert verdict([0.7, 0.8], 0.95) == "NOT met"
    assert verdict([1.5, 1.9], 2.0, higher_is_better=False) == "met"
    # Contended runs are left out while two clean ones remain...
    assert verdict([0.40, 0.97, 0.99], 0.95, contended=[True, False, False]) == "met; 1 contended run left out"
    # ...and judged with the rest when fewer remain, which the verdict says.
    judged = verdict([0.40, 0.97], 0.95, contended=[True, False])
    assert judged.startswith("no verdict") and "fewer than 2 clean runs" in judged
