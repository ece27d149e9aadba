"""What the trials so far say a config cannot beat: bounds that let the adaptive search skip it unmeasured.

Three things are learned from the server's own timing (the ``X-Servetune-*`` headers, per stage in an app):

- **Each family's batch curve.** The handler's time per batch, ``h(b) = a + c·b`` (as BentoML's CORK fits it),
  through the fastest batch seen at each size for one family and thread setting (contention only slows a batch
  down, so the fastest is the closest to the model's own cost). A config's workers cannot serve more than
  ``workers × b / h(b)`` requests a second, and, when its batches fill (``Load.batch_monotone``), no request of it
  waits less than ``h(b)``.
- **The host's parallelism.** ``throughput × h(b) / b`` is how many batches' worth of work a trial kept running at
  once (in an app, summed over its models). Once a trial ran more workers than that without going faster, the
  host is saturated: no config keeps more running, so its throughput is at most ``parallelism × b / h(b)`` (in an
  app, ``parallelism / sum of h(b) / b``: its models share the host).
- **Whether the batch delay matters.** When a config's batches were full, a longer or shorter delay changes
  nothing: its delay neighbours are not measured.

A bound is a prediction from a fitted line, so a config is skipped only when its bound misses the best score by
more than ``MARGIN`` (or its latency bound misses the SLA by that much). Nothing else is assumed about the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from servetune.bench.result import BenchResult
from servetune.tune.study import Config, Point, Study
from servetune.tune.trial import Trial

MARGIN = 0.15  # how far a bound must miss before the config is skipped
SATURATED = 1.3  # a trial ran this many times more workers than it kept busy: the host was full
FULL = 0.9  # a config's batches were full when their mean size reached this share of its batch size

CurveKey = tuple[str, int, int, bool]  # family, threads, inter-op threads, pinning


def curve_key(config: Config) -> CurveKey:
    return config.family, config.threads, config.inter_op_threads, config.pinning


class Curve:
    """A family's handler time per batch, ``a + c·b``, through the fastest batch seen at each size."""

    def __init__(self) -> None:
        self.fastest: dict[float, float] = {}  # mean batch size -> fastest handler mean, ms

    def add(self, batch: float, handler_ms: float) -> None:
        size = round(batch, 1)
        self.fastest[size] = min(handler_ms, self.fastest.get(size, handler_ms))

    def predict(self, batch: int) -> float | None:
        """Handler ms of a batch of ``batch``; None until two sizes are known (a line needs two points)."""
        points = sorted(self.fastest.items())
        if len(points) < 2:
            return None
        n = len(points)
        mean_b = sum(b for b, _ in points) / n
        mean_h = sum(h for _, h in points) / n
        spread = sum((b - mean_b) ** 2 for b, _ in points)
        slope = max(0.0, sum((b - mean_b) * (h - mean_h) for b, h in points) / spread) if spread else 0.0
        intercept = mean_h - slope * mean_b
        return max(intercept + slope * batch, 1e-3)


class Bounds:
    def __init__(self, study: Study) -> None:
        self.study = study
        self.curves: dict[CurveKey, Curve] = {}
        self.parallelism = 0.0  # the most batches' worth of work a trial kept running at once
        self.saturated = False
        self.full: set[Point] = set()  # configs whose batches were full

    def learn(self, trials: Iterable[Trial]) -> None:
        self.curves.clear()
        self.full.clear()
        measured = [t for t in trials if t.status == "ok" and t.result is not None]
        for trial in measured:
            for config, stage in self._stages(trial):
                srv = stage.server
                if srv is not None and srv.handler is not None and srv.batch_size_mean:
                    self.curves.setdefault(curve_key(config), Curve()).add(srv.batch_size_mean, srv.handler.mean_ms)
            if self._all_full(trial):
                self.full.add(trial.config)
        self.parallelism, self.saturated = 0.0, False
        for trial in measured:
            busy = self._busy(trial)
            if busy is None:
                continue
            self.parallelism = max(self.parallelism, busy)
            running = sum(config.workers for config in trial.config.parts)
            self.saturated |= running >= SATURATED * busy

    def _stages(self, trial: Trial) -> list[tuple[Config, BenchResult]]:
        assert trial.result is not None
        if not self.study.is_app:
            return [(trial.config.parts[0], trial.result)]
        pairs = zip(self.study.model_names, trial.config.parts, strict=True)
        return [(config, trial.result.stages[name]) for name, config in pairs if name in trial.result.stages]

    def _all_full(self, trial: Trial) -> bool:
        stages = self._stages(trial)
        return bool(stages) and all(
            stage.server is not None
            and stage.server.batch_size_mean is not None
            and stage.server.batch_size_mean >= FULL * config.batch_size
            for config, stage in stages
        )

    def _busy(self, trial: Trial) -> float | None:
        """Batches' worth of work the trial kept running at once, at the families' own speed."""
        total = 0.0
        for config, stage in self._stages(trial):
            cost = self._cost(config)
            if cost is None:
                return None
            total += stage.throughput_rps * cost
        return total

    def _cost(self, config: Config) -> float | None:
        """Seconds of a worker per request at the family's own speed: h(b) / b."""
        curve = self.curves.get(curve_key(config))
        handler = curve.predict(config.batch_size) if curve is not None else None
        return None if handler is None else handler / 1000 / config.batch_size

    def throughput(self, point: Point) -> float | None:
        """At most this many requests (pipelines) a second; None when a family's curve is not known yet."""
        costs = [self._cost(config) for config in point.parts]
        if any(c is None for c in costs):
            return None
        known = [c for c in costs if c is not None]
        bound = min(config.workers / cost for config, cost in zip(point.parts, known, strict=True))
        if self.saturated and self.parallelism > 0:
            bound = min(bound, self.parallelism * (1 + MARGIN) / sum(known))
        return bound

    def handler(self, config: Config) -> float | None:
        """A full batch's handler time (ms) at the family's own speed; None when unknown."""
        curve = self.curves.get(curve_key(config))
        return curve.predict(config.batch_size) if curve is not None else None

    def latency(self, point: Point) -> float | None:
        """No request waits less than this (ms) end to end when the batches fill; None when unknown."""
        floors = [self.handler(config) for config in point.parts]
        return None if any(f is None for f in floors) else sum(f for f in floors if f is not None)

    def cannot_win(self, point: Point, best: float, batches_fill: bool) -> str | None:
        """Why ``point`` cannot beat the best objective ``best`` (or meet the SLA), or None."""
        if self.study.objective.kind == "throughput" and best > 0:
            bound = self.throughput(point)
            if bound is not None and bound < (1 - MARGIN) * best:
                return f"at most {bound:.1f} req/s by the batch curves, below the best {best:.1f}"
        if not batches_fill:
            return None
        floor = self.latency(point)
        limits = [limit for _, limit in self.study.sla.limits()]
        if floor is not None and limits and floor > (1 + MARGIN) * min(limits):
            return f"its batches alone take {floor:.0f} ms, over the SLA"
        for model, config in zip(self.study.models, point.parts, strict=False):
            own = self.handler(config)
            limits = [limit for _, limit in model.sla.limits()]
            if own is not None and limits and own > (1 + MARGIN) * min(limits):
                return f"{model.name}'s batches alone take {own:.0f} ms, over its SLA"
        return None

    def same_but_delay(self, point: Point) -> Point | None:
        """A measured config whose batches were full and that differs from ``point`` only in batch delays: the
        delay never expired there, so it changes nothing."""
        for full in self.full:
            if (
                all(
                    dataclasses.replace(a, batch_delay_ms=b.batch_delay_ms) == b
                    for a, b in zip(full.parts, point.parts, strict=True)
                )
                and full != point
            ):
                return full
        return None
