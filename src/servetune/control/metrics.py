"""The controllers' Prometheus metrics, read when scraped (a collector the backend registers with its metrics):

- ``servetune_controller_batches_total{reason}``: batches dispatched, by why they went (full, delay, deadline, solo,
  reserve: taken by a worker held in reserve, its oldest request waiting past the law's worst case);
- ``servetune_controller_shed_total``: requests answered 503 because they were predicted to miss their deadline;
- ``servetune_controller_knob_changes_total``;
- ``servetune_controller_batch_size``, ``..._max_batch_delay_ms``, ``..._workers``: the knobs now, and
  ``..._threads`` (intra-op threads per worker) for a controller that moves them (``bounds.threads``);
- ``servetune_controller_reserve_workers``: of the workers, those held in reserve (they take only batches whose
  oldest request waited past the law's worst case);
- ``servetune_controller_arrival_rate``: requests per second, last half second;
- ``servetune_controller_predicted_batch_ms_total`` and ``..._actual_batch_ms_total`` over
  ``servetune_controller_predicted_batches_total``: how good the predictions are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from servetune.control.controller import Controller

LABELS = ["model_name", "model_version"]


class ControllerMetrics:
    """``controllers``: read at each scrape; ``labels``: more labels on every sample (a Ray replica's ``worker_id``)."""

    def __init__(self, controllers: Callable[[], list[Controller]], labels: Mapping[str, str] | None = None) -> None:
        self._controllers = controllers
        self._names = list(labels or {})
        self._values = list((labels or {}).values())

    def collect(self) -> Iterator[Metric]:
        p = "servetune_controller_"
        labels = [*LABELS, *self._names]
        batches = CounterMetricFamily(p + "batches", "Batches dispatched, by reason", labels=[*labels, "reason"])
        shed = CounterMetricFamily(p + "shed", "Requests shed: predicted to miss their deadline", labels=labels)
        changes = CounterMetricFamily(p + "knob_changes", "Knob changes the controller made", labels=labels)
        predicted = CounterMetricFamily(p + "predicted_batches", "Batches with a predicted time", labels=labels)
        predicted_ms = CounterMetricFamily(p + "predicted_batch_ms", "Predicted batch time, summed", labels=labels)
        actual_ms = CounterMetricFamily(p + "actual_batch_ms", "Actual time of those batches, summed", labels=labels)
        gauges = {
            "batch_size": GaugeMetricFamily(p + "batch_size", "Batch size now", labels=labels),
            "max_batch_delay_ms": GaugeMetricFamily(p + "max_batch_delay_ms", "Batch delay now (ms)", labels=labels),
            "workers": GaugeMetricFamily(p + "workers", "Workers now", labels=labels),
            "threads": GaugeMetricFamily(p + "threads", "Intra-op threads per worker now", labels=labels),
        }
        reserve = GaugeMetricFamily(p + "reserve_workers", "Workers held in reserve now", labels=labels)
        rate = GaugeMetricFamily(p + "arrival_rate", "Arrivals per second, last half second", labels=labels)
        for c in self._controllers():
            key = [c.name, c.version, *self._values]
            for reason, count in c.batches.items():
                batches.add_metric([*key, reason], count)
            shed.add_metric(key, c.shed_count)
            changes.add_metric(key, c.knob_changes)
            predicted.add_metric(key, c.predicted_batches)
            predicted_ms.add_metric(key, c.predicted_ms_sum)
            actual_ms.add_metric(key, c.actual_ms_sum)
            knobs = c.actuator.knobs().to_json()
            for name, gauge in gauges.items():
                if name in knobs:  # threads: only where the controller moves them
                    gauge.add_metric(key, float(knobs[name]))
            reserve.add_metric(key, float(c.reserve))
            rate.add_metric(key, c.meter.rate(c.clock()))
        yield from (batches, shed, changes, predicted, predicted_ms, actual_ms, *gauges.values(), reserve, rate)


__all__ = ["ControllerMetrics"]
