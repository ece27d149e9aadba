"""One trial: put the server in the proposed config (through the management API), load it, record everything.

Each model of the point is moved to its config by the steps ``servetune.tune.change.plan_change`` gives for the
target's capabilities (scale; batching, threads and pinning in place; or register again), cheapest first.

After a load run that set threads or pinning, each worker's own figures (describe's ``numThreads``,
``interOpThreads``, ``cpuCores``, read by the worker process itself, which applies a change from its next batch)
are checked against what was asked, and kept with the trial: a run on a config the workers did not take is an
error, never a measurement.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from functools import partial
from typing import Any

from servetune._exceptions import BenchError, ConfigError
from servetune.bench import BenchResult
from servetune.tune import capacity
from servetune.tune.change import (
    THREAD_KNOBS,
    Capabilities,
    Register,
    Served,
    apply_step,
    archive_of,
    default_knobs,
    knobs_of,
    plan_change,
)
from servetune.tune.management import ManagementError, worker_memory
from servetune.tune.measure import Measurer
from servetune.tune.strategies.base import Proposal
from servetune.tune.study import Config, Point, Study
from servetune.tune.targets import Target
from servetune.tune.trial import Trial, figures_of, judge

PLACEMENT_KEYS = ("pid", "numThreads", "interOpThreads", "cpuCores")


class TrialRunner:
    def __init__(self, study: Study, target: Target) -> None:
        self.study = study
        self.target = target
        self.measurer = Measurer(study, target)
        self._served: dict[str, Served] = {}  # model -> what it is served from, and the config it is in
        self._started = False

    def use(self, study: Study) -> None:
        """Measure for ``study`` from now on (the same study with its SLA resolved on this machine)."""
        self.study = self.measurer.study = study

    def start(self) -> None:
        """Start the target (once; the first trial does it otherwise)."""
        if not self._started:
            self.target.start()
            self._started = True

    def run(self, proposal: Proposal, index: int) -> Trial:
        self.start()
        config = proposal.config
        started = time.monotonic()
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        make = partial(
            Trial, index=index, config=config, repeat=proposal.repeat, started_at=stamp, reason=proposal.reason,
            phase=proposal.phase,
        )  # fmt: skip
        self.measurer.attempts = []
        try:
            self.configure(config)
        except (ManagementError, ConfigError) as exc:
            if isinstance(exc, ManagementError) and exc.status != 400:  # refused: as it was; else start afresh
                self._served.clear()
            trial: Trial = make(status="error", error=str(exc))
            return dataclasses.replace(trial, wall_s=round(time.monotonic() - started, 3))
        setup_s = time.monotonic() - started
        try:
            trial = self._measure(config, make)
        except (BenchError, ConfigError) as exc:
            trial = make(status="error", error=f"load run failed: {exc}")
        return dataclasses.replace(trial, setup_s=round(setup_s, 3), wall_s=round(time.monotonic() - started, 3),
                                   attempts=tuple(self.measurer.attempts))  # fmt: skip

    # ---- configuring ----------------------------------------------------------------------------------------

    def configure(self, point: Point) -> None:
        """Put every model in its part of ``point`` (the steps: ``servetune.tune.change.plan_change``)."""
        for name, config in zip(self.study.model_names, point.parts, strict=True):
            self._configure(name, config)

    def _configure(self, name: str, config: Config) -> None:
        capabilities = self.capabilities
        current = self._served.get(name)
        registered = current is None and capabilities.can_register and self._is_served(name)
        steps = plan_change(current, config, capabilities, registered=registered)
        management = self.target.management
        for i, step in enumerate(steps):
            try:
                apply_step(step, management, name, self._url)
            except ManagementError as exc:
                if exc.status != 400 or i > 0:  # a refused first step changed nothing; else: state unknown
                    self._served.pop(name, None)
                raise
        self._served[name] = Served(archive_of(config, capabilities), config)

    @property
    def capabilities(self) -> Capabilities:
        target = self.target
        return Capabilities(target.can_register, target.can_rebatch, target.knobs_in_place, target.pinning)

    def _url(self, step: Register) -> str:
        """Where a registration's archive comes from: the family's, or, when its archive is the family's copy with
        the thread knobs written in (``servetune.tune.change.archive_of``), that copy (one per setting)."""
        config = step.config
        family = self.study.family(config.family)
        if step.archive != config.family:
            knobs = {k: v for k, v in knobs_of(config).items() if v}
            written = {THREAD_KNOBS[k][2]: v for k, v in knobs.items()}
            suffix = "".join(f"-{k[0]}{int(v)}" for k, v in knobs.items())
            family = dataclasses.replace(
                family, label=family.label + suffix, model_config={**family.model_config, **written}
            )
        return self.target.archive_url(family)

    def _is_served(self, name: str) -> bool:
        try:
            self.target.management.describe(name)
        except ManagementError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # ---- measuring ------------------------------------------------------------------------------------------

    def _measure(self, point: Point, make: Callable[..., Trial]) -> Trial:
        load = self.measurer.load
        measurer = self.measurer
        if load.mode == "capacity":

            def passes(result: BenchResult) -> bool:
                return judge(figures_of(result), point, self.study).passed

            found = capacity.search(
                lambda n: measurer.closed(point, n),
                lambda r: measurer.opened(point, r),
                passes,
                measurer.clients(point) * 2,
                load.steps,
            )
            result = found.result
            extra: dict[str, Any] = {"probes": found.probes, "capacity_rps": found.rate}
            shape: dict[str, Any] = {"rate": round(found.rate, 3), "arrival": load.arrival}
        elif load.mode == "trace":
            result, extra = measurer.replay(point), {}
            schedule = measurer.schedule
            shape = {"trace": schedule.name if schedule is not None else ""}
        else:
            clients = measurer.clients(point)
            result, extra, shape = measurer.closed(point, clients), {}, {"concurrency": clients}
        memory = gpu_memory = 0
        placement: dict[str, tuple[dict[str, Any], ...]] = {}
        problems = []
        for name, config in zip(self.study.model_names, point.parts, strict=True):
            try:
                described = self.target.management.describe(name)
            except ManagementError:
                described = {}
            memory += worker_memory(described)
            gpu_memory += worker_memory(described, "gpuMemoryUsage")
            if not default_knobs(config) or self.capabilities.knobs_in_place:
                workers = [w for w in described.get("workers") or [] if isinstance(w, Mapping)]
                placement[name] = tuple({k: w[k] for k in PLACEMENT_KEYS if k in w} for w in workers)
                if problem := placement_problems(config, placement[name]):
                    problems.append(f"{name}: the workers did not take {config.key}: {problem}")
        status, error = ("error", "; ".join(problems)) if problems else ("ok", "")
        return make(status=status, error=error, result=result, memory_bytes=memory, gpu_memory_bytes=gpu_memory,
                    load=shape, placement=placement, **extra)  # fmt: skip


def placement_problems(config: Config, workers: tuple[Mapping[str, Any], ...]) -> str:
    """What the workers report that differs from ``config`` ("" when nothing does). A server that reports no
    figure for a knob the config sets cannot be checked, and is said so."""
    problems: list[str] = []
    for field, (_, key, _) in THREAD_KNOBS.items():
        wanted = getattr(config, field)
        if field == "pinning" or not wanted:
            continue
        reported = [w.get(key) for w in workers]
        if any(value is None for value in reported):
            problems.append(f"{key} not reported by the server (it does not support {key})")
        elif any(value != wanted for value in reported):
            problems.append(f"{key}={sorted(set(map(str, reported)))} (asked {wanted})")
    if config.pinning:
        cores = [w.get("cpuCores") for w in workers]
        if any(not isinstance(c, list) or not c for c in cores):
            problems.append("cpuCores not reported by the server (it does not support cpuPinning)")
        else:
            seen: set[int] = set()
            for own in cores:
                assert isinstance(own, list)
                if seen & set(own):
                    problems.append(f"cpuCores overlap: {cores}")
                    break
                seen |= set(own)
    return "; ".join(problems)
