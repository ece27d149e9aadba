"""The API's histograms are observed without prometheus_client's locks; scraped, they must read exactly as
prometheus_client's own Histogram reads for the same observations (names, labels, cumulative buckets, count, sum)."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from servetune.api.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, ApiMetrics


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_histograms_scrape_as_prometheus_client_histograms() -> None:
    metrics = ApiMetrics()
    reference = CollectorRegistry(auto_describe=False)
    labels = ["model_name", "model_version"]
    latency = Histogram(
        "servetune_request_latency_seconds",
        "End-to-end latency in the server, request received to response",
        labels,
        buckets=LATENCY_BUCKETS,
        registry=reference,
    )
    queue = Histogram(
        "servetune_queue_seconds",
        "Time a request waited before its batch was sent to a worker",
        labels,
        buckets=LATENCY_BUCKETS,
        registry=reference,
    )
    handler = Histogram(
        "servetune_handler_seconds",
        "Time the worker's handler spent on the batch a request ran in",
        labels,
        buckets=LATENCY_BUCKETS,
        registry=reference,
    )
    batch = Histogram(
        "servetune_batch_size",
        "Number of requests in each batch sent to a worker",
        labels,
        buckets=BATCH_BUCKETS,
        registry=reference,
    )
    rng = random.Random(3)
    # values on the bounds themselves (a bound is inclusive), between them, past the last one, and zero
    values = [*LATENCY_BUCKETS, 0.0, 45.0, *(rng.lognormvariate(-4, 2) for _ in range(500))]
    for i, total in enumerate(values):
        model = ("a", "1.0") if i % 3 else ("b", "2.0")
        q, h = total / 2, (total / 4 if i % 5 else None)
        metrics.observe_request(*model, total, q, h)
        latency.labels(*model).observe(total)
        queue.labels(*model).observe(q)
        child = handler.labels(*model)  # the child exists (zero counts) before its first observation, as ours
        if h is not None:
            child.observe(h)
        size = 1 + i % 130
        metrics.observe_batch(*model, size)
        batch.labels(*model).observe(size)
    ours = [line for line in _without_created(generate_latest(metrics.registry)) if "servetune_" in line]
    theirs = _without_created(generate_latest(reference))
    assert ours == theirs
    # a NaN is dropped, not counted in a bucket and the sum
    before = generate_latest(metrics.registry)
    metrics.observe_batch("a", "1.0", math.nan)  # type: ignore[arg-type]
    assert generate_latest(metrics.registry) == before


def test_each_histogram_child_has_its_created_time() -> None:
    metrics = ApiMetrics()
    metrics.observe_request("a", "1.0", 0.01, 0.002, 0.005)
    text = generate_latest(metrics.registry).decode()
    created = [line for line in text.splitlines() if line.startswith("servetune_request_latency_seconds_created")]
    assert len(created) == 1 and 'model_name="a"' in created[0]
    assert float(created[0].split()[-1]) > 1.7e9
