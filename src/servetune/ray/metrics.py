"""Metrics on Ray: each replica keeps the API layer's metrics of the requests it answered and reports them every
second to one small actor (``servetune-metrics``); the driver sums the reports of every replica into the metrics API
(port 8082), so that ``ts_inference_requests_total`` and the latency histograms count every request, whichever
replica served it. Without a servetune driver (``serve deploy`` / KubeRay) there is no sink and replicas report
nothing: use Ray's own metrics there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

log = logging.getLogger("servetune.ray")

SINK_NAME = "servetune-metrics"
SINK_NAMESPACE = "servetune"
REPORT_EVERY_S = 1.0

# (family name, type, documentation, [(sample name, labels, value)])
Family = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


class MetricsSink:
    """A Ray actor holding the latest report of each replica (counters only grow, so the latest one is the total),
    and the latest state of each replica's online controller (``servetune.control``), for the driver's describe."""

    def __init__(self) -> None:
        self.reports: dict[str, list[Family]] = {}
        self.controllers: dict[str, dict[str, Any]] = {}

    def report(self, source: str, families: list[Family], controller: dict[str, Any] | None = None) -> None:
        self.reports[source] = families
        if controller is not None:
            self.controllers[source] = controller

    def collect(self) -> list[list[Family]]:
        return list(self.reports.values())

    def controllers_of(self, prefix: str) -> dict[str, dict[str, Any]]:
        """The controllers of the sources named ``prefix`` + pid, by pid."""
        return {s[len(prefix) :]: c for s, c in self.controllers.items() if s.startswith(prefix)}


def snapshot(registry: CollectorRegistry) -> list[Family]:
    """The registry's samples, less the ``_created`` timestamps (they cannot be added up)."""
    return [
        (
            f.name,
            f.type,
            f.documentation,
            [(s.name, dict(s.labels), float(s.value)) for s in f.samples if not s.name.endswith("_created")],
        )
        for f in registry.collect()
    ]


def start_sink() -> Any:
    """The driver's sink actor (one per cluster namespace; an existing one is reused)."""
    import ray

    sink = ray.remote(MetricsSink).options(  # type: ignore[attr-defined]
        name=SINK_NAME, namespace=SINK_NAMESPACE, num_cpus=0, get_if_exists=True
    )
    return sink.remote()


class Reporter:
    """A replica's side: report ``registry`` to the sink every second, from the replica's event loop."""

    def __init__(
        self, registry: CollectorRegistry, source: str, controller: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        self.registry = registry
        self.source = source
        self.controller = controller  # the replica's controller's describe, reported with the metrics
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        import ray

        try:
            sink = ray.get_actor(SINK_NAME, namespace=SINK_NAMESPACE)
        except ValueError:
            return  # no servetune driver: nobody to report to
        while True:
            with contextlib.suppress(Exception):  # a driver that went away must not break serving
                described = self.controller() if self.controller is not None else None
                sink.report.remote(self.source, snapshot(self.registry), described)
            await asyncio.sleep(REPORT_EVERY_S)


class SummedReports:
    """A Prometheus collector over the sink's reports: samples with the same name and labels are added up."""

    def __init__(self) -> None:
        self.reports: list[list[Family]] = []

    def collect(self) -> Iterator[Metric]:
        families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
        for report in self.reports:
            for name, kind, doc, samples in report:
                _, _, sums = families.setdefault(name, (kind, doc, {}))
                for sample, labels, value in samples:
                    key = (sample, tuple(sorted(labels.items())))
                    sums[key] = sums.get(key, 0.0) + value
        for name, (kind, doc, sums) in sorted(families.items()):
            metric = Metric(name, doc, kind)
            for (sample, label_items), value in sums.items():
                metric.add_sample(sample, dict(label_items), value)
            yield metric

    async def refresh_forever(self, sink: Any) -> None:
        """Poll the sink every second (a scrape then never waits on Ray)."""
        import ray

        while True:
            with contextlib.suppress(Exception):
                self.reports = await asyncio.to_thread(ray.get, sink.collect.remote(), timeout=5.0)
            await asyncio.sleep(REPORT_EVERY_S)


__all__ = ["MetricsSink", "Reporter", "SummedReports", "snapshot", "start_sink"]
