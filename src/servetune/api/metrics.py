"""Prometheus metrics: TorchServe's names (exact) plus real histograms per model, and the metrics API (port 8082).

The API's gateway observes every prediction (``observe_request``, ``observe_status``); a backend adds what only it
knows: batch sizes (``observe_batch``, where a batch ends) and gauges of its workers and queues (``register`` a
collector, see :class:`ModelGauges`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from servetune.api.rest import exception_handlers, json_response

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)


class _TorchServeCounters:
    """``ts_inference_requests_total`` and the two cumulative-µs counters, named exactly as TorchServe names them
    (prometheus_client would append ``_total`` to a Counter's samples)."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.requests: dict[tuple[str, str], float] = {}
        self.latency_us: dict[tuple[str, str], float] = {}
        self.queue_us: dict[tuple[str, str], float] = {}
        self.status_classes: dict[str, float] = {"Requests2XX": 0.0, "Requests4XX": 0.0, "Requests5XX": 0.0}

    def collect(self) -> Iterator[Metric]:
        for name, store, doc in (
            ("ts_inference_requests_total", self.requests, "Total number of inference requests."),
            ("ts_inference_latency_microseconds", self.latency_us, "Cumulative inference duration in microseconds"),
            ("ts_queue_latency_microseconds", self.queue_us, "Cumulative queue duration in microseconds"),
        ):
            metric = Metric(name, doc, "counter")
            for (model, version), value in sorted(store.items()):
                labels = {"model_name": model, "model_version": version, "hostname": self.hostname}
                metric.add_sample(name, labels, value)
            yield metric
        for name, value in self.status_classes.items():
            metric = Metric(name, f"Total number of requests with a {name[-3]}xx response", "counter")
            metric.add_sample(name, {"Level": "Host", "Hostname": self.hostname}, value)
            yield metric


class ModelGauges:
    """``servetune_workers`` and ``servetune_queue_depth`` per model version, read when scraped from ``models()``:
    (name, version, ready workers, requests waiting)."""

    def __init__(self, models: Callable[[], list[tuple[str, str, int, int]]]) -> None:
        self._models = models

    def collect(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily(
            "servetune_workers", "Worker processes ready to serve", labels=["model_name", "model_version"]
        )
        queue = GaugeMetricFamily(
            "servetune_queue_depth", "Requests waiting in the model's queue", labels=["model_name", "model_version"]
        )
        for name, version, ready, waiting in self._models():
            workers.add_metric([name, version], ready)
            queue.add_metric([name, version], waiting)
        yield workers
        yield queue


class WorkerMemoryGauges:
    """``servetune_worker_rss_bytes`` and ``servetune_worker_pss_bytes`` per worker process, read when scraped from
    ``workers()``: (model name, version, worker id, RSS, PSS or None). PSS splits each shared page among the
    processes mapping it (the weights workers of one model share, torch's libraries), so the PSS of all workers
    adds up to what they really cost; RSS counts shared pages in full for each. A model whose workers are forked from
    a parent process has a row for that process too, worker id ``parent``."""

    def __init__(self, workers: Callable[[], list[tuple[str, str, str, int, int | None]]]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "model_version", "worker_id"]
        rss = GaugeMetricFamily("servetune_worker_rss_bytes", "Resident memory of a worker process", labels=labels)
        pss = GaugeMetricFamily(
            "servetune_worker_pss_bytes", "Proportional set size of a worker process", labels=labels
        )
        for name, version, worker, resident, proportional in self._workers():
            rss.add_metric([name, version, worker], resident)
            if proportional is not None:
                pss.add_metric([name, version, worker], proportional)
        yield rss
        yield pss


class ApiMetrics:
    """The metrics of the requests this process answers. ``observing=False``: a registry for collectors only (the
    Ray driver, which answers no prediction itself but sums its replicas' reports)."""

    def __init__(self, observing: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.observing = observing
        if not observing:
            return
        self.ts = _TorchServeCounters(socket.gethostname())
        self.registry.register(self.ts)  # type: ignore[arg-type]
        labels = ["model_name", "model_version"]
        self.latency = Histogram(
            "servetune_request_latency_seconds",
            "End-to-end latency in the server, request received to response",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue = Histogram(
            "servetune_queue_seconds",
            "Time a request waited before its batch was sent to a worker",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.handler = Histogram(
            "servetune_handler_seconds",
            "Time the worker's handler spent on the batch a request ran in",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "servetune_batch_size",
            "Number of requests in each batch sent to a worker",
            labels,
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self._labelled: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}

    def _children(self, key: tuple[str, str]) -> tuple[Any, Any, Any, Any]:
        """The four labelled histograms of a model version, looked up once (``labels()`` costs ~3 µs each)."""
        found = self._labelled.get(key)
        if found is None:
            latency, queue = self.latency.labels(*key), self.queue.labels(*key)
            found = self._labelled[key] = (latency, queue, self.handler.labels(*key), self.batch_size.labels(*key))
        return found

    def observe_request(
        self, model: str, version: str, total_s: float, queue_s: float | None, handler_s: float | None
    ) -> None:
        """A prediction the backend answered: its latency in the server, its queue and handler time (its status is
        counted by :meth:`observe_status`)."""
        key = (model, version)
        latency, queue, handler, _ = self._children(key)
        self.ts.requests[key] = self.ts.requests.get(key, 0.0) + 1
        self.ts.latency_us[key] = self.ts.latency_us.get(key, 0.0) + total_s * 1e6
        if queue_s is not None:
            self.ts.queue_us[key] = self.ts.queue_us.get(key, 0.0) + queue_s * 1e6
            queue.observe(queue_s)
        if handler_s is not None:
            handler.observe(handler_s)
        latency.observe(total_s)

    def observe_status(self, status: int) -> None:
        """An answer to a prediction, counted in its status class (2xx, 4xx, 5xx)."""
        bucket = {2: "Requests2XX", 4: "Requests4XX", 5: "Requests5XX"}.get(status // 100)
        if bucket:
            self.ts.status_classes[bucket] += 1

    def observe_batch(self, model: str, version: str, size: int) -> None:
        """A batch of ``size`` requests ran (where the batch ends: the native pool, a Ray replica)."""
        self._children((model, version))[3].observe(size)

    def batch_observer(self, model: str, version: str) -> Callable[[int], None]:
        """:meth:`observe_batch` for one model version, its histogram looked up once (a no-op when not observing)."""
        if not self.observing:
            return _ignore
        observe: Callable[[int], None] = self._children((model, version))[3].observe
        return observe

    def register(self, collector: object) -> None:
        """Add a backend's own collector (anything with ``collect()``), e.g. :class:`ModelGauges`."""
        self.registry.register(collector)  # type: ignore[arg-type]


def _ignore(size: int) -> None:
    """A batch observer of metrics that observe nothing."""


class _Named:
    """The metrics of a registry whose family name, or one of whose sample names, is in ``names`` (TorchServe's
    ``name[]`` filter). prometheus_client's ``restricted_registry`` finds only collectors that describe their names up
    front, which TorchServe's counters and the gauges (collected when scraped) do not."""

    def __init__(self, registry: CollectorRegistry, names: list[str]) -> None:
        self.registry = registry
        self.names = frozenset(names)

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            if metric.name in self.names:
                yield metric
                continue
            samples = [s for s in metric.samples if s.name in self.names]
            if samples:
                kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                kept.samples = samples
                yield kept


def create_metrics_app(metrics: ApiMetrics) -> Starlette:
    """``GET /metrics[?name[]=...]`` in Prometheus text format, never token-checked (as TorchServe)."""

    async def metrics_endpoint(request: Request) -> Response:
        names = request.query_params.getlist("name[]")
        registry: Any = _Named(metrics.registry, names) if names else metrics.registry
        return Response(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def api_description(request: Request) -> Response:
        return json_response(
            {
                "openapi": "3.0.1",
                "info": {"title": "servetune metrics API", "version": "1"},
                "paths": {
                    "/metrics": {
                        "get": {"operationId": "metrics", "responses": {"200": {"description": "Prometheus text"}}}
                    }
                },
            }
        )

    return Starlette(
        routes=[Route("/metrics", metrics_endpoint, methods=["GET"]), Route("/", api_description, methods=["OPTIONS"])],
        exception_handlers=exception_handlers(),
    )


__all__ = ["ApiMetrics", "ModelGauges", "WorkerMemoryGauges", "create_metrics_app"]
