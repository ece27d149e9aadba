"""The server breakdown for servers that send no timing headers: deltas of their Prometheus /metrics.

TorchServe exposes cumulative counters (``ts_inference_requests_total``, ``ts_inference_latency_microseconds``,
``ts_queue_latency_microseconds``, with ``metrics_mode=prometheus`` or ``legacy``): their deltas give mean queue
and mean server latency per request. servetune also exports histograms (``servetune_queue_seconds``,
``servetune_handler_seconds``, ``servetune_batch_size``), whose bucket deltas give percentiles (interpolated
within a bucket, so as coarse as the buckets).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import aiohttp

from servetune._exceptions import BenchError
from servetune.bench.result import Distribution, ServerBreakdown

# name -> {frozenset(labels) -> value}
Samples = dict[str, dict[frozenset[tuple[str, str]], float]]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> Samples:
    """Parse Prometheus text format 0.0.4 (also the Java client's trailing-comma label sets)."""
    samples: Samples = defaultdict(dict)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples[name][frozenset(_LABEL.findall(labels or ""))] = number
    return dict(samples)


async def scrape(url: str, timeout: float = 10.0) -> Samples:
    """GET a /metrics page (``url`` may be the metrics address or the full /metrics URL)."""
    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(target) as response:
                text = await response.text()
                if response.status != 200:
                    raise BenchError(f"metrics_url={url!r}: GET {target} answered {response.status}")
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise BenchError(f"metrics_url={url!r}: cannot read {target}: {exc}") from exc
    return parse_prometheus(text)


def _total(samples: Samples, name: str, model: str | None, **extra: str) -> float:
    total = 0.0
    for labels, value in samples.get(name, {}).items():
        tags = dict(labels)
        if model is not None and tags.get("model_name", model) != model:
            continue
        if all(tags.get(k) == v for k, v in extra.items()):
            total += value
    return total


def _delta(before: Samples, after: Samples, name: str, model: str | None, **extra: str) -> float:
    return _total(after, name, model, **extra) - _total(before, name, model, **extra)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile from cumulative (upper bound, count) buckets, linear within the bucket (as PromQL does)."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def _histogram(before: Samples, after: Samples, name: str, model: str | None, scale: float) -> Distribution | None:
    count = _delta(before, after, f"{name}_count", model)
    if count <= 0:
        return None
    bounds = {dict(labels).get("le") for labels in after.get(f"{name}_bucket", {})}
    buckets = [(float(le), _delta(before, after, f"{name}_bucket", model, le=le)) for le in bounds if le is not None]

    def q(p: float) -> float | None:
        value = histogram_quantile(buckets, p)
        return None if value is None else value * scale

    return Distribution(
        mean_ms=_delta(before, after, f"{name}_sum", model) / count * scale,
        p50_ms=q(0.5),
        p90_ms=q(0.9),
        p99_ms=q(0.99),
    )


def metrics_breakdown(before: Samples, after: Samples, model: str | None) -> ServerBreakdown | None:
    """The breakdown between two scrapes, or None if the server exposed none of the known metrics."""
    requests = _delta(before, after, "ts_inference_requests_total", model)
    queue = _histogram(before, after, "servetune_queue_seconds", model, 1e3)
    handler = _histogram(before, after, "servetune_handler_seconds", model, 1e3)
    total = _histogram(before, after, "servetune_request_latency_seconds", model, 1e3)
    if requests > 0:
        if queue is None and "ts_queue_latency_microseconds" in after:
            queue = Distribution(mean_ms=_delta(before, after, "ts_queue_latency_microseconds", model) / requests / 1e3)
        if total is None and "ts_inference_latency_microseconds" in after:
            us = _delta(before, after, "ts_inference_latency_microseconds", model)
            total = Distribution(mean_ms=us / requests / 1e3)
    batches = _delta(before, after, "servetune_batch_size_count", model)
    batch_mean = _delta(before, after, "servetune_batch_size_sum", model) / batches if batches > 0 else None
    if requests <= 0 and queue is None and handler is None:
        return None
    return ServerBreakdown(
        source="metrics",
        requests=int(requests),
        queue=queue,
        handler=handler,
        total=total,
        batch_size_mean=batch_mean,
    )
