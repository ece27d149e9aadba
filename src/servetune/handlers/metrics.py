"""The handler-side metrics cache (``context.metrics``) and the ``@timed`` decorator.

Same calls as TorchServe's ``MetricsCacheYamlImpl`` (``add_time``, ``add_counter``, ``add_size``,
``add_percent``, ``add_metric``, ``add_error``, ``add_metric_to_cache``, ``get_metric``) and its
``CachingMetric.add_or_update``. Values are recorded in memory (the most recent ``MAX_SAMPLES`` per
metric) and stay retrievable through ``get_metric(...).samples`` and ``MetricsCache.samples()``; they are
not exported anywhere yet. ``ts.metrics.dimension``, ``ts.metrics.metric_type_enum`` and
``ts.handler_utils.timer`` resolve to this module.
"""

from __future__ import annotations

import enum
import functools
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

logger = logging.getLogger(__name__)

MAX_SAMPLES = 1000

P = ParamSpec("P")
R = TypeVar("R")


class MetricTypes(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Dimension:
    name: str
    value: str

    def __str__(self) -> str:
        return f"{self.name}:{self.value}"


class Sample(NamedTuple):
    # a tuple: one is made per batch (PredictionTime) on the worker's hot path, and a frozen dataclass costs more
    value: float
    dimension_values: tuple[str, ...]
    request_id: str
    timestamp: float


class Metric:
    """One named metric and its recent samples."""

    def __init__(self, metric_name: str, unit: str, dimension_names: list[str], metric_type: MetricTypes) -> None:
        self.metric_name = metric_name
        self.unit = unit
        self.dimension_names = list(dimension_names)
        self.metric_type = metric_type
        self.samples: deque[Sample] = deque(maxlen=MAX_SAMPLES)

    def add_or_update(self, value: float, dimension_values: list[str] | None = None, request_id: str = "") -> None:
        values = list(dimension_values or [])
        if len(values) != len(self.dimension_names):
            names = self.dimension_names
            logger.error("metric %s: dimension values %s do not match %s", self.metric_name, values, names)
            return
        if self.metric_type is MetricTypes.COUNTER and value < 0:
            logger.error("metric %s: a counter cannot be updated with a negative value (%s)", self.metric_name, value)
            return
        self.samples.append(Sample(float(value), tuple(str(v) for v in values), request_id or "", time.time()))

    def update(self, value: float, request_id: str = "", dimensions: list[Dimension] | None = None) -> None:
        """TorchServe's backwards-compatible form: the dimensions given replace the metric's."""
        dims = list(dimensions or [])
        self.dimension_names = [d.name for d in dims]
        self.add_or_update(value, [d.value for d in dims], request_id)

    @property
    def last(self) -> float | None:
        return self.samples[-1].value if self.samples else None


class MetricsCache:
    """``context.metrics``: metrics keyed by (type, name)."""

    def __init__(self, model_name: str | None = None) -> None:
        self.model_name = model_name
        self.request_ids: dict[int, str] | str | None = None
        self.cache: dict[tuple[MetricTypes, str], Metric] = {}
        # the dimensions a metric gets when the caller names none, with a request id (True) or without: made once
        self._defaults = {
            has_request: (
                [d.name for d in self._dimensions("" if has_request else None, None)],
                tuple(d.value for d in self._dimensions("" if has_request else None, None)),
            )
            for has_request in (True, False)
        }

    def set_request_ids(self, request_ids: dict[int, str] | str | None) -> None:
        self.request_ids = request_ids

    def _request_id(self, idx: int | None) -> str | None:
        ids = self.request_ids
        if isinstance(ids, dict):
            if idx is not None and idx in ids:
                return ids[idx]
            return ",".join(ids.values())
        return ids

    def _dimensions(self, request_id: str | None, dimensions: list[Dimension] | None) -> list[Dimension]:
        dims = list(dimensions or [])
        names = {d.name for d in dims}
        if request_id is not None and "ModelName" not in names:
            dims.append(Dimension("ModelName", str(self.model_name)))
        if "Level" not in names:
            dims.append(Dimension("Level", "Model" if request_id is not None else "Error"))
        return dims

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> Metric:
        metric = Metric(metric_name, unit, list(dimension_names or []), metric_type)
        self.cache[(metric_type, metric_name)] = metric
        return metric

    def get_metric(self, metric_name: str, metric_type: MetricTypes = MetricTypes.COUNTER) -> Metric:
        try:
            return self.cache[(metric_type, metric_name)]
        except KeyError:
            raise KeyError(f"Metric of type {metric_type.value!r} and name {metric_name!r} doesn't exist") from None

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: int | None = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        request_id = self._request_id(idx)
        metric = self.cache.get((metric_type, name))
        if dimensions is None:  # the common case (the PredictionTime of every batch): no Dimension objects made
            names, values = self._defaults[request_id is not None]
            if metric is None:
                metric = self.add_metric_to_cache(name, unit, names, metric_type)
            if metric.dimension_names == names and (value >= 0 or metric.metric_type is not MetricTypes.COUNTER):
                metric.samples.append(Sample(float(value), values, request_id or "", time.time()))
                return
        dims = self._dimensions(request_id, dimensions)
        if metric is None:
            metric = self.add_metric_to_cache(name, unit, [d.name for d in dims], metric_type)
        metric.add_or_update(value, [d.value for d in dims], request_id or "")

    def add_counter(
        self, name: str, value: float, idx: int | None = None, dimensions: list[Dimension] | None = None
    ) -> None:
        self.add_metric(name, value, "count", idx, dimensions, MetricTypes.COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "ms",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("ms", "s"):
            raise ValueError("the unit for a timed metric should be one of ['ms', 's']")
        self.add_metric(name, value, unit, idx, dimensions, metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "MB",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("MB", "kB", "GB", "B"):
            raise ValueError("The unit for size based metric is one of ['MB','kB', 'GB', 'B']")
        self.add_metric(name, value, unit, idx, dimensions, metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self.add_metric(name, value, "percent", idx, dimensions, metric_type)

    def add_error(self, name: str, value: float, dimensions: list[Dimension] | None = None) -> None:
        dims = self._dimensions(None, dimensions)
        metric = self.cache.get((MetricTypes.COUNTER, name))
        if metric is None:
            metric = self.add_metric_to_cache(name, "", [d.name for d in dims], MetricTypes.COUNTER)
        metric.add_or_update(value, [d.value for d in dims])

    def samples(self) -> Iterator[tuple[Metric, Sample]]:
        """Every recorded sample still held, metric by metric."""
        for metric in self.cache.values():
            for sample in metric.samples:
                yield metric, sample


def timed(func: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """Record ``ts_handler_<name>`` (ms) when model-config.yaml has ``handler: {profile: true}``."""

    def wrapper(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        context = getattr(self, "context", None)
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        handler_config = yaml_config.get("handler")
        if not (isinstance(handler_config, dict) and handler_config.get("profile")):
            return func(self, *args, **kwargs)
        start = time.perf_counter()
        result = func(self, *args, **kwargs)
        _synchronize_cuda()
        context.metrics.add_time("ts_handler_" + func.__name__, (time.perf_counter() - start) * 1000.0)  # type: ignore[union-attr]
        return result

    functools.update_wrapper(wrapper, func)
    return wrapper


def _synchronize_cuda() -> None:
    # Only when torch is already loaded and CUDA is in use: timing must not pull torch or CUDA in.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
