"""From recorded samples to BenchResult: what counts as an error, which samples make the figures, JSON."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

from servetune.bench import BenchResult, BenchSpec
from servetune.bench.recording import CONNECTION, TIMEOUT, UNKNOWN, Recording, summarise

URL = "http://127.0.0.1:8080/predictions/m"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def recording(window_s: float = 10.0) -> Recording:
    rec = Recording(window_s=window_s, cpu_seconds=1.0)
    for i in range(1000):  # latencies 1..1000 ms, batch sizes 1 and 4 (one batch of 4 answers 4 requests)
        rec.add(i / 100, float(i + 1), 200, 0.5, 10.0, 4 if i % 5 else 1)
    for status in (503, 503, 404, TIMEOUT, CONNECTION):
        rec.add(9.9, 1.0, status, math.nan, math.nan, 0)
    return rec


def test_errors_by_status_and_latency_over_successes_only() -> None:
    result = summarise(BenchSpec(url=URL, concurrency=2, requests=1005), recording(), NOW)
    assert result.sent == 1005 and result.succeeded == 1000
    assert result.errors == {"404": 1, "503": 2, "connection": 1, "timeout": 1}
    assert result.failed == 5 and result.error_rate == pytest.approx(5 / 1005)
    assert result.throughput_rps == pytest.approx(100.0)
    lat = result.latency
    assert lat is not None and lat.count == 1000  # the fast failures are not latency samples
    assert (lat.min_ms, lat.p50_ms, lat.p90_ms, lat.p99_ms, lat.p999_ms, lat.max_ms) == (1, 500, 900, 990, 999, 1000)
    assert lat.at_or_above_p99 == 11
    assert lat.p99_ci_low_ms is not None and lat.p99_ci_high_ms is not None
    assert lat.p99_ci_low_ms < 990 < lat.p99_ci_high_ms
    assert result.labels == {"model": "m"} and not result.unreliable


def test_server_breakdown_from_headers_averages_per_batch() -> None:
    result = summarise(BenchSpec(url=URL, concurrency=2, requests=1005), recording(), NOW)
    server = result.server
    assert server is not None and server.source == "headers" and server.requests == 1000
    assert server.handler is not None and server.handler.mean_ms == pytest.approx(10.0)
    # 800 requests saw batches of 4 (200 batches), 200 saw batches of 1 (200 batches): 1000 / 400 = 2.5 per batch
    assert server.batch_size_mean == pytest.approx(2.5)


def test_late_sends_make_an_open_loop_result_unreliable() -> None:
    spec = BenchSpec(url=URL, rate=100.0, duration=10.0)
    rec = recording()
    rec.scheduled, rec.late_sends, rec.max_late_ms = 1005, 10, 3.0
    assert not summarise(spec, rec, NOW).unreliable  # 10 of 1005 is under 1%
    rec.late_sends = 11
    result = summarise(spec, rec, NOW)
    assert result.unreliable and "11 of 1005" in result.reasons[0] and "worst 3.0 ms" in result.reasons[0]


def test_busy_client_is_flagged() -> None:
    rec = recording(window_s=1.0)
    rec.cpu_seconds = 0.95
    result = summarise(BenchSpec(url=URL, concurrency=1, requests=5), rec, NOW)
    assert result.client.bottleneck and any("95% of one core" in w for w in result.warnings)


def test_unknown_statuses_with_counted_failures() -> None:
    """ab's case: every answer's latency is a sample; failures are counted apart."""
    rec = Recording(window_s=2.0)
    for _ in range(10):
        rec.add(0.0, 5.0, UNKNOWN, math.nan, math.nan, 0)
    rec.extra_errors["non-2xx"] = 3
    result = summarise(BenchSpec(url=URL, concurrency=1, requests=10, engine="ab"), rec, NOW)
    assert (result.sent, result.succeeded, result.errors) == (10, 7, {"non-2xx": 3})
    assert result.latency is not None and result.latency.count == 10
    assert result.throughput_rps == pytest.approx(3.5)


def test_json_round_trip_keeps_everything_but_the_samples() -> None:
    spec = BenchSpec(url=URL, concurrency=2, requests=1005, labels={"batch_size": "4"})
    result = summarise(spec, recording(), NOW)
    data = result.to_dict()
    assert data["error_rate"] == pytest.approx(result.error_rate) and "samples" not in data
    assert data["client"]["bottleneck"] is False and data["started_at"] == "2026-01-02T03:04:05+00:00"
    again = BenchResult.from_json(result.to_json())
    assert again == result and again.samples is None
    assert again.server == result.server and again.latency == result.latency


def test_nothing_succeeded() -> None:
    rec = Recording(window_s=1.0)
    rec.add(0.0, 1.0, 503, math.nan, math.nan, 0)
    result = summarise(BenchSpec(url=URL, concurrency=1, requests=1), rec, NOW)
    assert result.latency is None and result.throughput_rps == 0.0 and result.server is None
    assert BenchResult.from_json(result.to_json()) == result
