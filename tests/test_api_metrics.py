"""The API's metrics: what one prediction observes, read back through the Prometheus text the metrics API serves."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from servetune.api.metrics import BATCH_BUCKETS, ApiMetrics


def test_api_metrics_count_each_observation_once() -> None:
    metrics = ApiMetrics()
    for total in (0.0004, 0.002, 0.2):
        metrics.observe_request("noop", "1.0", total, 0.0001, 0.00005)
    metrics.observe_request("noop", "1.0", 0.003, None, None)  # no queue or handler time: those not observed
    metrics.observe_batch("noop", "1.0", 3)
    metrics.observe_batch("noop", "1.0", 1)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}

    def sample(family: str, name: str, **labels: str) -> float:
        want = {"model_name": "noop", "model_version": "1.0", **labels}
        return next(s.value for s in families[family].samples if s.name == name and s.labels == want)

    latency = "servetune_request_latency_seconds"
    assert sample(latency, f"{latency}_count") == 4
    assert sample(latency, f"{latency}_sum") == 0.0004 + 0.002 + 0.2 + 0.003
    assert sample(latency, f"{latency}_bucket", le="0.001") == 1
    assert sample(latency, f"{latency}_bucket", le="0.0025") == 2
    assert sample(latency, f"{latency}_bucket", le="+Inf") == 4
    assert sample("servetune_queue_seconds", "servetune_queue_seconds_count") == 3
    assert sample("servetune_handler_seconds", "servetune_handler_seconds_count") == 3
    assert sample("servetune_batch_size", "servetune_batch_size_count") == 2
    assert sample("servetune_batch_size", "servetune_batch_size_sum") == 4
    assert sample("servetune_batch_size", "servetune_batch_size_bucket", le="1.0") == 1
    assert sample("servetune_batch_size", "servetune_batch_size_bucket", le=str(float(BATCH_BUCKETS[3]))) == 2
    assert sample("ts_inference_requests_total", "ts_inference_requests_total", hostname=metrics.ts.hostname) == 4
