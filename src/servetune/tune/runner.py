"""One trial: put the server in the proposed config (through the management API), load it, record everything.

Each model of the point is reconfigured as cheaply as the change allows: only the workers differ -> scale (works
under load, no restart); the batch size or delay differ -> change them in place (servetune's
``PUT /models/{name}?batch_size=``; a server that ignores it, TorchServe, gets the next option); intra-op threads
and pinning differ -> in place too (``?num_threads=&cpu_pinning=``, from the next batch), inter-op threads restart
the workers (``?inter_op_threads=``); the family differs -> unregister and register again. A server that does not
set threads and pinning in place (it does not echo them in describe) gets them written into the family's archive
(``numThreads``, ``interOpThreads``, ``cpuPinning`` in its model-config.yaml), one archive per setting.

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
from servetune.tune.management import ManagementError, worker_memory
from servetune.tune.measure import Measurer
from servetune.tune.strategies.base import Proposal
from servetune.tune.study import Config, Family, Point, Study
from servetune.tune.targets import Target
from servetune.tune.trial import Trial, figures_of, judge

# Config field -> (management API parameter, describe key, model-config.yaml key)
THREAD_KNOBS = {
    "threads": ("num_threads", "numThreads", "numThreads"),
    "inter_op_threads": ("inter_op_threads", "interOpThreads", "interOpThreads"),
    "pinning": ("cpu_pinning", "cpuPinning", "cpuPinning"),
}
PLACEMENT_KEYS = ("pid", "numThreads", "interOpThreads", "cpuCores")


def knobs_of(config: Config) -> dict[str, int | bool]:
    return {field: getattr(config, field) for field in THREAD_KNOBS}


def default_knobs(config: Config) -> bool:
    return not any(knobs_of(config).values())


class TrialRunner:
    def __init__(self, study: Study, target: Target) -> None:
        self.study = study
        self.target = target
        self.measurer = Measurer(study, target)
        self._served: dict[str, tuple[str, Config]] = {}  # model -> (archive served, config it is in)
        self._started = False
        self._rebatch = True  # until the server shows it ignores in-place batching
        self._in_place: bool | None = None  # the server sets threads and pinning in place (None: not asked yet)

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
        except ManagementError as exc:
            if exc.status != 400:  # a refused change leaves the model as it was; anything else: start afresh
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
        """Put every model in its part of ``point``."""
        for name, config in zip(self.study.model_names, point.parts, strict=True):
            self._configure(name, config)

    def _configure(self, name: str, config: Config) -> None:
        management = self.target.management
        served = self._served.get(name)
        if served is not None and served[1] == config:
            return
        archive = self._archive(config)
        if served is not None and served[0] == archive:
            params: dict[str, Any] = {}
            old = served[1]
            if (old.batch_size, old.batch_delay_ms) != (config.batch_size, config.batch_delay_ms):
                if not (self.target.can_rebatch and self._rebatch):
                    return self._register(name, config, archive)
                params.update(batch_size=config.batch_size, max_batch_delay=config.batch_delay_ms)
            knobs = self._knob_params(old, config)  # the archive is the same: they can change in place, or may
            params.update(knobs)
            if knobs and config.workers < old.workers:
                management.scale(name, config.workers)  # fewer workers first: pinned core sets must fit them
            if "batch_size" in params:
                self._rebatch = management.rebatch(name, workers=config.workers, **params)
                if not self._rebatch:
                    return self._register(name, config, archive)
            elif params:
                management.set(name, workers=config.workers, **params)
            elif old.workers != config.workers:
                management.scale(name, config.workers)
            self._served[name] = (archive, config)
            if knobs and self._in_place is None:
                self._in_place = self._echoes_knobs(name)
                if not self._in_place:  # written into the archive instead, once per setting
                    self._register(name, config, self._archive(config))
            return
        if served is None and self.target.can_rebatch and self._rebatch and not self.target.can_register:
            # A running server whose model API is off: batching changes in place, the family is what it serves.
            self._rebatch = management.rebatch(
                name, batch_size=config.batch_size, max_batch_delay=config.batch_delay_ms, workers=config.workers
            )
            if self._rebatch:
                self._served[name] = (archive, config)
                return
        if not self.target.can_register:
            # A server whose model API is off: only the workers move (the space was reduced to match).
            management.scale(name, config.workers)
            self._served[name] = (archive, config)
            return
        self._register(name, config, archive)

    def _register(self, name: str, config: Config, archive: str) -> None:
        management = self.target.management
        if name in self._served or self._is_served(name):
            management.unregister(name)
            self._served.pop(name, None)
        family = self._family(config)
        url = self.target.archive_url(family)
        set_after = not default_knobs(config) and self._in_place is not False and archive == config.family
        # Workers start once, with their threads, when the knobs can be set before they start.
        management.register(url, name, batch_size=config.batch_size, max_batch_delay=config.batch_delay_ms,
                            workers=0 if set_after and self._in_place else config.workers)  # fmt: skip
        self._served[name] = (archive, dataclasses.replace(config, threads=0, inter_op_threads=0, pinning=False))
        if set_after:
            defaults = dataclasses.replace(config, threads=0, inter_op_threads=0, pinning=False)
            management.set(name, workers=config.workers, **self._knob_params(defaults, config))
            if self._in_place is None:
                self._in_place = self._echoes_knobs(name)
                if not self._in_place:  # written into the archive instead, once per setting
                    return self._register(name, config, self._archive(config))
        self._served[name] = (archive, config)

    def _archive(self, config: Config) -> str:
        """Which archive serves ``config``: its family's, or, when threads and pinning cannot change in place, the
        family's copy with them written in."""
        if self._in_place is not False or default_knobs(config):
            return config.family
        return config.family + "".join(f"|{k}={v}" for k, v in knobs_of(config).items() if v)

    def _family(self, config: Config) -> Family:
        family = self.study.family(config.family)
        if self._in_place is not False or default_knobs(config):
            return family
        written = {THREAD_KNOBS[k][2]: v for k, v in knobs_of(config).items() if v}
        suffix = "".join(f"-{k[0]}{int(v)}" for k, v in knobs_of(config).items() if v)
        return dataclasses.replace(family, label=family.label + suffix, model_config={**family.model_config, **written})

    @staticmethod
    def _knob_params(old: Config, new: Config) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for field, (param, _, _) in THREAD_KNOBS.items():
            value = getattr(new, field)
            if value != getattr(old, field):
                params[param] = str(value).lower() if isinstance(value, bool) else value
        return params

    def _echoes_knobs(self, name: str) -> bool:
        return "numThreads" in self.target.management.describe(name)

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
            if not default_knobs(config) or self._in_place:
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
