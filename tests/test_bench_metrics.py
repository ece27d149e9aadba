"""The /metrics fallback: parsing Prometheus text (TorchServe's Java format too) and the deltas of a run."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from servetune.bench.metrics import histogram_quantile, metrics_breakdown, parse_prometheus

TS_BEFORE = """\
# HELP ts_inference_requests_total Total number of inference requests.
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="resnet",model_version="default",hostname="h",} 10.0
ts_inference_requests_total{model_name="other",model_version="default",hostname="h",} 99.0
# TYPE ts_inference_latency_microseconds counter
ts_inference_latency_microseconds{model_name="resnet",model_version="default",hostname="h",} 500000.0
ts_inference_latency_microseconds{model_name="other",model_version="default",hostname="h",} 1.0E9
# TYPE ts_queue_latency_microseconds counter
ts_queue_latency_microseconds{model_name="resnet",model_version="default",hostname="h",} 100000.0
ts_queue_latency_microseconds{model_name="other",model_version="default",hostname="h",} 1.0E9
"""
TS_AFTER = (
    TS_BEFORE.replace('hostname="h",} 10.0', 'hostname="h",} 110.0')
    .replace("} 500000.0", "} 3500000.0")
    .replace("} 100000.0", "} 1100000.0")
)


def test_parse_java_format_with_trailing_commas_and_exponents() -> None:
    samples = parse_prometheus(TS_BEFORE)
    series = samples["ts_inference_latency_microseconds"]
    assert series[frozenset({("model_name", "other"), ("model_version", "default"), ("hostname", "h")})] == 1e9
    assert len(samples["ts_inference_requests_total"]) == 2


def test_torchserve_counters_give_means_per_request_for_the_model_only() -> None:
    breakdown = metrics_breakdown(parse_prometheus(TS_BEFORE), parse_prometheus(TS_AFTER), "resnet")
    assert breakdown is not None
    assert breakdown.source == "metrics" and breakdown.requests == 100
    assert breakdown.queue is not None and breakdown.queue.mean_ms == pytest.approx(10.0)  # 1e6 us / 100
    assert breakdown.total is not None and breakdown.total.mean_ms == pytest.approx(30.0)
    assert breakdown.queue.p99_ms is None and breakdown.handler is None


def test_servetune_histograms_give_percentiles_and_batch_mean() -> None:
    registry = CollectorRegistry()
    labels = ["model_name", "model_version"]
    buckets = (0.005, 0.01, 0.025, 0.05, 0.1)
    handler = Histogram("servetune_handler_seconds", "h", labels, buckets=buckets, registry=registry)
    batch = Histogram("servetune_batch_size", "b", labels, buckets=(1, 2, 4, 8), registry=registry)
    handler.labels("m", "1.0").observe(0.001)  # before the run
    before = parse_prometheus(generate_latest(registry).decode())
    for _ in range(90):
        handler.labels("m", "1.0").observe(0.02)
    for _ in range(10):
        handler.labels("m", "1.0").observe(0.07)
    for size in (4, 4, 2):
        batch.labels("m", "1.0").observe(size)
    after = parse_prometheus(generate_latest(registry).decode())
    breakdown = metrics_breakdown(before, after, "m")
    assert breakdown is not None and breakdown.handler is not None
    assert breakdown.handler.mean_ms == pytest.approx(25.0)
    assert breakdown.handler.p50_ms is not None and 10.0 < breakdown.handler.p50_ms <= 25.0
    assert breakdown.handler.p99_ms is not None and 50.0 < breakdown.handler.p99_ms <= 100.0
    assert breakdown.batch_size_mean == pytest.approx(10 / 3)
    assert metrics_breakdown(before, before, "m") is None


def test_histogram_quantile_interpolates_within_a_bucket() -> None:
    buckets = [(0.1, 50.0), (0.2, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.1)
    assert histogram_quantile(buckets, 0.75) == pytest.approx(0.15)
    assert histogram_quantile(buckets, 0.25) == pytest.approx(0.05)
    assert histogram_quantile([(float("inf"), 0.0)], 0.5) is None
