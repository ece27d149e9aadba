"""Reports: TorchServe's ab_report.csv columns (a superset, same order), report.md, samples.csv and the plot."""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from servetune.bench import BenchResult, BenchSpec
from servetune.bench.recording import Recording, summarise
from servetune.bench.report import TORCHSERVE_COLUMNS, csv_row, markdown, print_summary, write_report

# benchmarks/utils/reporting.py in pytorch/serve: the columns its ab_report.csv starts with.
TORCHSERVE_AB_REPORT = [
    "Benchmark", "TS failed requests", "TS throughput", "TS latency P50", "TS latency P90", "TS latency P99",
    "TS latency mean", "TS error rate", "Batch size", "Batch delay", "Workers", "Model", "Concurrency", "Input",
    "Requests", "Model_p50", "Model_p90", "Model_p99", "Queue time p50", "Queue time p90", "Queue time p99",
    "predict_mean", "handler_time_mean", "waiting_time_mean",
]  # fmt: skip


def result(mode: str = "closed") -> BenchResult:
    rec = Recording(window_s=4.0, cpu_seconds=0.2)
    for i in range(400):
        rec.add(i / 100, 20.0 + i % 10, 200, 1.0 + i % 3, 18.0, 2)
    rec.add(3.99, 1.0, 503, math.nan, math.nan, 0)
    spec = (
        BenchSpec(url="http://h:8080/predictions/m", concurrency=4, requests=401, labels={"batch_size": "2"})
        if mode == "closed"
        else BenchSpec(url="http://h:8080/predictions/m", rate=100.0, duration=4.0)
    )
    return summarise(spec, rec, datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_csv_row_is_a_superset_of_torchserve_ab_report_in_order() -> None:
    row = csv_row(result())
    assert list(row)[: len(TORCHSERVE_AB_REPORT)] == TORCHSERVE_AB_REPORT
    assert set(TORCHSERVE_COLUMNS) <= set(row)
    assert row["Benchmark"] == "servetune async"
    assert row["TS failed requests"] == 1 and row["Requests"] == 401
    assert row["TS error rate"] == pytest.approx(100 / 401, abs=1e-4)  # a percentage, as TorchServe writes it
    assert row["TS throughput"] == 100.0 and row["Concurrency"] == 4 and row["Batch size"] == "2"
    assert row["TS latency P50"] == 24.0 and row["TS latency P99"] == 29.0
    assert row["Model_p50"] == 18.0 and row["Queue time p99"] == 3.0 and row["waiting_time_mean"] == 1.998
    assert row["Errors"] == "503:1" and row["Model"] == "m"


def test_markdown_and_terminal_summary_carry_the_figures() -> None:
    text = markdown(result("open"))
    assert "open loop (100 req/s constant)" in text and "| throughput | 100.00 req/s |" in text
    assert "(503: 1)" in text and "late sends" in text and "P99 95% CI" in text
    from rich.console import Console

    console = Console(record=True, width=120)
    print_summary(result(), console)
    shown = console.export_text()
    assert "100.00 req/s" in shown and "P99 / P99.9" in shown and "mean batch size" in shown


def test_write_report_writes_every_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    written = write_report(result(), out)
    assert {p.name for p in written} == {
        "result.json", "ab_report.csv", "report.md", "samples.csv", "requests.jsonl", "latency.png",
    }  # fmt: skip
    assert BenchResult.from_json((out / "result.json").read_text()).sent == 401
    json.loads((out / "result.json").read_text())
    with (out / "ab_report.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1 and rows[0]["TS latency P99"] == "29.0"
    with (out / "samples.csv").open() as handle:
        samples = list(csv.DictReader(handle))
    assert len(samples) == 401 and samples[-1]["status"] == "503" and samples[-1]["queue_ms"] == ""
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 401 and [x["intended_s"] for x in lines] == sorted(x["intended_s"] for x in lines)
    assert lines[0] == {"intended_s": 0.0, "sent_s": 0.0, "latency_ms": 20.0, "status": 200, "queue_ms": 1.0,
                        "handler_ms": 18.0, "batch_size": 2}  # fmt: skip
    failed = next(x for x in lines if x["status"] == 503)
    assert failed["queue_ms"] is None and failed["batch_size"] is None
    assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "latency.png").stat().st_size > 10_000
