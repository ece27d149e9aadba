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
from collections.abc import Callable
from typing import TYPE_CHECKING

from servetune._exceptions import ConfigError
from servetune.bench import BenchResult, BenchSpec, LatencySummary, run_bench, run_together
from servetune.bench.recording import Recording
from servetune.bench.schedule import Schedule
from servetune.tune.confidence import decider
from servetune.tune.protocols import PROTOCOLS
from servetune.tune.study import Family, Load, Point, Study
from servetune.tune.trial import Attempt

if TYPE_CHECKING:
    from servetune.tune.targets import Target


class Measurer:
    """Makes a trial's load runs. Each run ends early once its figures decide the trial (``confidence.py``) when the
    load allows it, and is measured again when other processes disturbed it or the client fell behind its schedule
    (``Study.contention``); ``attempts`` lists every run of the current trial, kept or not."""

    def __init__(self, study: Study, target: Target) -> None:
        self.study = study
        self.target = target
        self.load: Load = study.families[0].load
        self.best_objective: float | None = None  # the best objective met so far (set by the loop before a trial)
        self.attempts: list[Attempt] = []
        self.busy_runs = 0  # load runs in a row still contended after every retry: the machine is busy throughout
        self.notes: list[str] = []
        self.schedule: Schedule | None = None  # a trace load's schedule, the same for every config

    def _enough(self, point: Point, rate: float | None) -> Callable[[Recording, float], bool] | None:
        load = self.load
        if not load.early_stop or load.duration_s is None or load.mode == "trace":
            return None
        best = self.best_objective
        if best is not None and rate is None and not self.study.is_app:
            device = self.study.family(point.parts[0].family).device
            best = best / self.study.objective.value(1.0, device)  # the throughput that objective stands for
        return decider(self.study.sla, None if rate is not None else best)

    def retries(self) -> int:
        """Retries for the next run: none while the machine stays busy (a run stayed contended after all its retries:
        a hog that does not go away cannot be waited out; the figures are marked instead, and retries resume after
        the first run measured in peace), the study's otherwise."""
        if self.busy_runs >= 1:
            return 0
        return self.study.contention.retries

    def _settle(self, kept: BenchResult, runs: int) -> None:
        if kept.contended and runs > 1:
            self.busy_runs += 1
            if not self.notes:
                self.notes.append(
                    "the machine stayed busy with other processes through a measurement and its retries: later runs "
                    "were not measured again while it stayed busy (their figures are marked contended)"
                )
        elif not kept.contended:
            self.busy_runs = 0

    def run(self, point: Point, spec: BenchSpec) -> BenchResult:
        """One load run of the trial, measured again while it was contended or unreliable (bounded)."""
        load = self.load
        longest = load.longest_s
        if longest is not None and spec.duration is not None and load.mode != "trace":
            spec = dataclasses.replace(spec, duration=longest)
        enough = self._enough(point, spec.rate)
        results: list[BenchResult] = []
        for _ in range(1 + self.retries()):
            result = run_bench(spec, enough=enough, min_seconds=min_seconds(load.duration_s or 0.0))
            results.append(result)
            self.attempts.append(Attempt.of(result, kept=False))
            if not (result.contended or result.unreliable):
                break
        kept = min(range(len(results)), key=lambda i: _disturbance(results[i]))
        self.attempts[len(self.attempts) - len(results) + kept] = Attempt.of(results[kept], kept=True)
        self._settle(results[kept], len(results))
        return results[kept]

    def clients(self, point: Point) -> int:
        """Closed-loop clients: the study's number, or enough to fill every worker's batch (in an app, of every
        model at once: a pipeline's clients are at one stage at a time)."""
        if self.load.concurrency is not None:
            return self.load.concurrency
        return max(1, math.ceil(self.load.factor * sum(p.workers * p.batch_size for p in point.parts)))

    def closed(self, point: Point, clients: int) -> BenchResult:
        if self.study.is_app and not self.study.pipeline:
            return self._mix(point, clients=clients)
        return self.run(point, self.spec(point, concurrency=clients))

    def opened(self, point: Point, rate: float) -> BenchResult:
        if self.study.is_app and not self.study.pipeline:
            return self._mix(point, rate=rate)
        return self.run(point, self.spec(point, rate=rate))

    def replay(self, point: Point) -> BenchResult:
        """A trace load: the study's schedule, the same for every config."""
        assert self.schedule is not None
        return self.run(point, self.spec(point, schedule=self.schedule))

    def spec(
        self,
        point: Point,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        schedule: Schedule | None = None,
    ) -> BenchSpec:
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
            schedule=schedule,
            arrival=load.arrival,
            requests=None if schedule is not None else load.requests,
            duration=None if schedule is not None else load.duration_s,
            warmup_requests=0 if schedule is not None else load.warmup_requests,
            warmup_seconds=0.0 if load.warmup_requests or schedule is not None else load.warmup_s,
            timeout=load.timeout_s,
            engine=self.engine(rate),
            metrics_url=self.target.metrics_url,
            labels=labels,
            stages=study.pipeline,
            hook_dir=study.source.parent if study.source is not None else None,
            slo=None if study.sla.empty else study.sla,
            server_pids=self.target.server_pids(),
            contended_cores=study.contention.max_other_cores,
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
                self.spec(point, concurrency=1),
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
        combined: list[BenchResult] = []
        for _ in range(1 + self.retries()):
            results = dict(zip(self.study.model_names, run_together(specs), strict=True))
            combined.append(combine_mix(results, {name: shares[name] / total for name in results}))
            self.attempts.append(Attempt.of(combined[-1], kept=False))
            if not any(r.contended or r.unreliable for r in results.values()):
                break
        kept = min(range(len(combined)), key=lambda i: _disturbance(combined[i]))
        self.attempts[len(self.attempts) - len(combined) + kept] = Attempt.of(combined[kept], kept=True)
        self._settle(combined[kept], len(combined))
        return combined[kept]


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
    hosts = [r.host for r in results.values() if r.host is not None]
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
        unreliable=any(r.unreliable for r in results.values()),
        reasons=[reason for r in results.values() for reason in r.reasons],
        host=max(hosts, key=lambda h: h.others_cores) if hosts else None,
        slo=None,
        throughput_low_rps=None,
        throughput_high_rps=None,
    )


MIN_DECIDE_S = 3.0


def min_seconds(duration_s: float) -> float:
    """The least a load run measures before its figures may end it: half its duration, and never under 3 s (or
    its whole duration when shorter): a decision on a second of data would rest on its first batches."""
    return max(duration_s / 2, min(duration_s, MIN_DECIDE_S))


def _disturbance(result: BenchResult) -> tuple[bool, float]:
    """Which of a trial's runs to keep: a reliable one first, then the least interference."""
    others = result.host.others_cores + (result.host.steal_cores or 0.0) if result.host is not None else 0.0
    return result.unreliable, others
