"""The handler metrics cache and @timed."""

from __future__ import annotations

import pytest

from servetune.handlers.metrics import Dimension, MetricsCache, MetricTypes, timed


def test_recorded_values_are_retrievable() -> None:
    cache = MetricsCache("resnet")
    cache.set_request_ids({0: "a", 1: "b"})
    cache.add_time("Latency", 12.5, idx=1)
    cache.add_time("Latency", 7.0, None, "ms")
    cache.add_counter("Seen", 2, dimensions=[Dimension("Kind", "cat")])
    cache.add_size("Payload", 1.5, unit="kB")
    cache.add_percent("Load", 40.0)
    cache.add_metric("Custom", 3, "items", metric_type=MetricTypes.HISTOGRAM)
    latency = cache.get_metric("Latency", MetricTypes.GAUGE)
    assert [s.value for s in latency.samples] == [12.5, 7.0]
    assert [s.request_id for s in latency.samples] == ["b", "a,b"]
    assert latency.dimension_names == ["ModelName", "Level"]
    assert latency.samples[0].dimension_values == ("resnet", "Model")
    seen = cache.get_metric("Seen")
    assert (seen.unit, seen.last, seen.dimension_names) == ("count", 2.0, ["Kind", "ModelName", "Level"])
    assert cache.get_metric("Payload", MetricTypes.GAUGE).unit == "kB"
    assert cache.get_metric("Load", MetricTypes.GAUGE).unit == "percent"
    assert cache.get_metric("Custom", MetricTypes.HISTOGRAM).last == 3.0
    assert len(list(cache.samples())) == 6


def test_invalid_units_and_missing_metrics() -> None:
    cache = MetricsCache("m")
    with pytest.raises(ValueError, match="timed metric"):
        cache.add_time("T", 1, unit="h")
    with pytest.raises(ValueError, match="size based metric"):
        cache.add_size("S", 1, unit="TB")
    with pytest.raises(KeyError, match="doesn't exist"):
        cache.get_metric("Nope")


def test_custom_metric_api_and_counter_validation() -> None:
    cache = MetricsCache("m")
    metric = cache.add_metric_to_cache("Requests", "count", ["Route"], MetricTypes.COUNTER)
    metric.add_or_update(1, ["/a"], "req-1")
    metric.add_or_update(-1, ["/a"])  # negative counter: logged and dropped
    metric.add_or_update(1, [])  # wrong dimensions: logged and dropped
    assert [(s.value, s.dimension_values, s.request_id) for s in metric.samples] == [(1.0, ("/a",), "req-1")]
    metric.update(5, "r", [Dimension("Other", "x")])
    assert metric.dimension_names == ["Other"] and metric.last == 5.0


class _Stage:
    def __init__(self, profile: bool) -> None:
        self.context = type(
            "Ctx", (), {"model_yaml_config": {"handler": {"profile": profile}}, "metrics": MetricsCache("m")}
        )()

    @timed
    def preprocess(self, x: int) -> int:
        return x + 1


@pytest.mark.parametrize("profile", [True, False])
def test_timed_records_only_when_profiling(profile: bool) -> None:
    stage = _Stage(profile)
    assert stage.preprocess(1) == 2
    recorded = list(stage.context.metrics.samples())
    assert [m.metric_name for m, _ in recorded] == (["ts_handler_preprocess"] if profile else [])
