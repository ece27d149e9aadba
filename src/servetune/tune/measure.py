"""How a point is loaded: the bench runs a trial makes, for one model, an app's pipeline, or an app's mix.

- One model: its prediction URL, closed loop with ``Load.clients`` or open loop at a rate.
- A pipeline: each request of the load is the app's call graph (``BenchSpec.stages``): the first stage gets its
  model's input, later stages what their hooks make of the previous answer; figures are end to end, and each
  model's stage has its own. Closed loop with enough clients to fill every model's batches at once.
- A mix (an app without a pipeline): every model loaded at the same time by its own stream, in the study's
  proportions (``mix``). The app's throughput is in those proportions (the scale of the mix served, in requests
  per second across the models), its latency the worst model's at each percentile, its errors the worst model's.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import TYPE_CHECKING

from servetune._exceptions import ConfigError
from servetune.bench import BenchResult, BenchSpec, LatencySummary, run_bench, run_together
from servetune.tune.protocols import PROTOCOLS
from servetune.tune.study import Family, Load, Point, Study

if TYPE_CHECKING:
    from servetune.tune.targets import Target


class Measurer:
    def __init__(self, study: Study, target: Target) -> None:
        self.study = study
        self.target = target
        self.load: Load = study.families[0].load

    def clients(self, point: Point) -> int:
        """Closed-loop clients: the study's number, or enough to fill every worker's batch (in an app, of every
        model at once: a pipeline's clients are at one stage at a time)."""
        if self.load.concurrency is not None:
            return self.load.concurrency
        return max(1, math.ceil(self.load.factor * sum(p.workers * p.batch_size for p in point.parts)))

    def closed(self, point: Point, clients: int) -> BenchResult:
        if self.study.is_app and not self.study.pipeline:
            return self._mix(point, clients=clients)
        return run_bench(self._spec(point, concurrency=clients))

    def opened(self, point: Point, rate: float) -> BenchResult:
        if self.study.is_app and not self.study.pipeline:
            return self._mix(point, rate=rate)
        return run_bench(self._spec(point, rate=rate))

    def _spec(self, point: Point, *, concurrency: int | None = None, rate: float | None = None) -> BenchSpec:
        study, load = self.study, self.load
        if study.is_app:
            first = self._family(point, study.pipeline[0].model if study.pipeline else study.model_names[0])
            url = self.target.inference_url
            labels = {"model": study.model, "config": point.key}
        else:
            config = point.parts[0]
            first = study.family(config.family)
            url = self.url(study.model)
            labels = {
                "model": study.model,
                "batch_size": str(config.batch_size),
                "batch_delay": str(config.batch_delay_ms),
                "workers": str(config.workers),
                "family": config.family,
            }
        return BenchSpec(
            url=url,
            input=first.input,
            content_type=first.content_type,
            form_field=first.form_field,
            headers=tuple(self.target.inference_headers.items()),
            concurrency=concurrency,
            rate=rate,
            arrival=load.arrival,
            requests=load.requests,
            duration=load.duration_s,
            warmup_requests=load.warmup_requests,
            warmup_seconds=0.0 if load.warmup_requests else load.warmup_s,
            timeout=load.timeout_s,
            engine=self.engine(rate),
            metrics_url=self.target.metrics_url,
            labels=labels,
            stages=study.pipeline,
            hook_dir=study.source.parent if study.source is not None else None,
        )

    def url(self, model: str) -> str:
        """Where ``model``'s requests go, by the load's protocol."""
        url = PROTOCOLS[self.load.protocol].url(self.target.inference_url, self.target.grpc_url, model)
        if url is None:
            raise ConfigError(f"load.protocol={self.load.protocol!r}: this server has no gRPC inference port")
        return url

    def engine(self, rate: float | None) -> str:
        """The protocol's engine; for TorchServe's API the load's (ab closed loop only; a pipeline: async)."""
        own = PROTOCOLS[self.load.protocol].engine
        if own is not None:
            return own
        return self.load.engine if rate is None and not self.study.pipeline else "async"

    def _family(self, point: Point, model: str) -> Family:
        index = self.study.model_names.index(model)
        return self.study.family(point.parts[index].family)

    def _mix(self, point: Point, *, clients: int | None = None, rate: float | None = None) -> BenchResult:
        shares = dict(self.study.mix)
        total = sum(shares.values())
        specs = []
        for name, part in zip(self.study.model_names, point.parts, strict=True):
            share = shares[name] / total
            family = self.study.family(part.family)
            spec = dataclasses.replace(
                self._spec(point, concurrency=1),
                url=self.url(name),
                input=family.input,
                content_type=family.content_type,
                form_field=family.form_field,
                stages=(),
                labels={"model": name, "config": point.key},
                concurrency=None if rate is not None else max(1, round((clients or 1) * share)),
                rate=None if rate is None else rate * share,
            )
            specs.append(spec)
        results = dict(zip(self.study.model_names, run_together(specs), strict=True))
        return combine_mix(results, {name: shares[name] / total for name in results})


_WORST = ("mean_ms", "min_ms", "max_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms")


def combine_mix(results: dict[str, BenchResult], shares: dict[str, float]) -> BenchResult:
    """The app's figures from its models' streams: throughput in the mix's proportions (the app served ``T`` req/s
    when every model served its share of ``T``), latency and errors the worst model's, each model as a stage."""
    throughput = min(r.throughput_rps / shares[name] for name, r in results.items())
    latencies = [r.latency for r in results.values() if r.latency is not None]
    latency = None
    if len(latencies) == len(results):
        worst = {key: max(getattr(lat, key) for lat in latencies) for key in _WORST}
        latency = LatencySummary(
            count=sum(lat.count for lat in latencies),
            at_or_above_p99=sum(lat.at_or_above_p99 for lat in latencies),
            **worst,
        )
    errors: Counter[str] = Counter()
    for result in results.values():
        errors.update(result.errors)
    first = next(iter(results.values()))
    return dataclasses.replace(
        first,
        url="mix: " + ", ".join(results),
        sent=sum(r.sent for r in results.values()),
        succeeded=sum(r.succeeded for r in results.values()),
        errors=dict(errors),
        throughput_rps=throughput,
        latency=latency,
        server=None,
        labels={"model": "mix"},
        stages=dict(results),
        warnings=["a mix: latency is the worst model's at each percentile"],
        samples=None,
    )
