"""One trial: put the server in the proposed config (through the management API), load it, record everything.

Reconfiguring is as cheap as the change allows: only the workers differ -> scale (works under load, no restart);
the batch size or delay differ -> change them in place (servetune's ``PUT /models/{name}?batch_size=``; a server
that ignores it, TorchServe, gets the next option); the family differs -> unregister and register again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from typing import Any

from servetune._exceptions import BenchError, ConfigError
from servetune.bench import BenchResult, BenchSpec, run_bench
from servetune.tune import capacity
from servetune.tune.management import ManagementError, worker_memory
from servetune.tune.strategies.base import Proposal
from servetune.tune.study import Config, Study
from servetune.tune.target import Target
from servetune.tune.trial import Trial, figures_of, judge


class TrialRunner:
    def __init__(self, study: Study, target: Target) -> None:
        self.study = study
        self.target = target
        self._registered: tuple[str, int, int] | None = None  # (family, batch size, delay) being served
        self._workers = 0
        self._started = False
        self._rebatch = True  # until the server shows it ignores in-place batching

    def run(self, proposal: Proposal, index: int) -> Trial:
        if not self._started:
            self.target.start()
            self._started = True
        config = proposal.config
        started = time.monotonic()
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        make = partial(
            Trial, index=index, config=config, repeat=proposal.repeat, started_at=stamp, reason=proposal.reason
        )
        try:
            self.configure(config)
        except ManagementError as exc:
            self._registered = None
            trial: Trial = make(status="error", error=str(exc))
            return replace(trial, wall_s=round(time.monotonic() - started, 3))
        setup_s = time.monotonic() - started
        try:
            trial = self._measure(config, make)
        except (BenchError, ConfigError) as exc:
            trial = make(status="error", error=f"load run failed: {exc}")
        return replace(trial, setup_s=round(setup_s, 3), wall_s=round(time.monotonic() - started, 3))

    def configure(self, config: Config) -> None:
        management, name = self.target.management, self.study.model
        wanted = (config.family, config.batch_size, config.batch_delay_ms)
        if self._registered == wanted:
            if self._workers != config.workers:
                management.scale(name, config.workers)
                self._workers = config.workers
            return
        same_family = self._registered is not None and self._registered[0] == config.family
        if self.target.can_rebatch and self._rebatch and (same_family or not self.target.can_register):
            self._rebatch = management.rebatch(
                name, batch_size=config.batch_size, max_batch_delay=config.batch_delay_ms, workers=config.workers
            )
            if self._rebatch:
                self._registered, self._workers = wanted, config.workers
                return
        if not self.target.can_register:
            # A server whose model API is off: only the workers move (the space was reduced to match).
            management.scale(name, config.workers)
            self._registered, self._workers = wanted, config.workers
            return
        url = self.target.archive_url(self.study.family(config.family))
        if self._registered is not None or self._served():
            management.unregister(name)
            self._registered = None
        management.register(
            url, name, batch_size=config.batch_size, max_batch_delay=config.batch_delay_ms, workers=config.workers
        )
        self._registered, self._workers = wanted, config.workers

    def _served(self) -> bool:
        try:
            self.target.management.describe(self.study.model)
        except ManagementError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _measure(self, config: Config, make: Callable[..., Trial]) -> Trial:
        family = self.study.family(config.family)
        load = family.load
        if load.mode == "capacity":

            def passes(result: BenchResult) -> bool:
                return judge(figures_of(result), config, self.study).passed

            clients = load.clients(config.workers, config.batch_size) * 2
            found = capacity.search(
                lambda n: self.bench(config, concurrency=n),
                lambda r: self.bench(config, rate=r),
                passes,
                clients,
                load.steps,
            )
            result = found.result
            extra: dict[str, Any] = {"probes": found.probes, "capacity_rps": found.rate}
            shape = {"rate": round(found.rate, 3), "arrival": load.arrival}
        else:
            clients = load.clients(config.workers, config.batch_size)
            result, extra, shape = self.bench(config, concurrency=clients), {}, {"concurrency": clients}
        try:
            described = self.target.management.describe(self.study.model)
        except ManagementError:
            described = {}
        memory, gpu_memory = worker_memory(described), worker_memory(described, "gpuMemoryUsage")
        return make(status="ok", result=result, memory_bytes=memory, gpu_memory_bytes=gpu_memory, load=shape, **extra)

    def bench(self, config: Config, *, concurrency: int | None = None, rate: float | None = None) -> BenchResult:
        family = self.study.family(config.family)
        load = family.load
        labels = {
            "model": self.study.model,
            "batch_size": str(config.batch_size),
            "batch_delay": str(config.batch_delay_ms),
            "workers": str(config.workers),
            "family": config.family,
        }
        spec = BenchSpec(
            url=f"{self.target.inference_url}/predictions/{self.study.model}",
            input=family.input,
            content_type=family.content_type,
            form_field=family.form_field,
            headers=tuple(self.target.inference_headers.items()),
            concurrency=concurrency,
            rate=rate,
            arrival=load.arrival,
            requests=load.requests,
            duration=load.duration_s,
            warmup_requests=load.warmup_requests,
            warmup_seconds=0.0 if load.warmup_requests else load.warmup_s,
            timeout=load.timeout_s,
            engine=load.engine if rate is None else "async",
            metrics_url=self.target.metrics_url,
            labels=labels,
        )
        return run_bench(spec)
