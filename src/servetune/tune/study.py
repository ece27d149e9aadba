"""A tuning study as plain data: what to serve, the space of deployments to try, how to load them, what must hold.

Frozen dataclasses and nothing else: no file is read here and no backend is known. ``loader.py`` reads the two YAML
forms (``forms/``) into a :class:`Study` and validates it before any trial; a backend's own settings travel as
opaque ``options`` that its target (``targets/``) reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from servetune.bench.host import CONTENDED_CORES
from servetune.bench.slo import Slo
from servetune.bench.spec import StageSpec

if TYPE_CHECKING:
    from pathlib import Path

DEVICES = ("cpu", "cuda")


# The SLA is the bench layer's SLO: the same limits, the same per-request deadline (goodput, attainment, windows).
Sla = Slo


@dataclass(frozen=True)
class Objective:
    """What to maximise among configs that meet the SLA: throughput, or requests per unit of money (``cost``)."""

    kind: Literal["throughput", "cost"] = "throughput"
    prices: tuple[tuple[str, float], ...] = ()  # device -> price per device-hour

    def price(self, device: str) -> float:
        return dict(self.prices)[device]

    def value(self, throughput_rps: float, device: str) -> float:
        """Higher is better: req/s, or requests per unit of money."""
        if self.kind == "throughput":
            return throughput_rps
        return throughput_rps * 3600.0 / self.price(device)

    def describe(self, value: float) -> str:
        if self.kind == "throughput":
            return f"{value:.1f} req/s"
        return f"{1e6 / value:.4g} per million requests" if value > 0 else "n/a"


@dataclass(frozen=True)
class Load:
    """How each config is loaded.

    ``concurrency``: closed loop with ``concurrency`` clients, or ``factor`` × batch size × workers when it is None
    (enough clients to fill every worker's batch, as the TorchServe case study advises).
    ``capacity``: open loop; per config, the highest request rate whose latency meets the SLA.
    ``trace``: open loop; every config replays the same ``trace`` (a file in any format of ``bench.traces``, read with
    ``trace_format``/``trace_options``, scaled by ``time_scale`` and ``rate_scale``, or with its peak at
    ``capacity_fraction`` of the default config's capacity), and is judged on the whole replay.

    ``early_stop``: a load run ends once its figures decide the trial (``confidence.py``), after half of
    ``duration_s`` at the least; an undecided one runs for ``max_duration_s`` (default ``duration_s``).
    """

    mode: Literal["concurrency", "capacity", "trace"] = "concurrency"
    concurrency: int | None = None
    factor: float = 1.0
    requests: int | None = None
    duration_s: float | None = 10.0
    warmup_s: float = 2.0
    warmup_requests: int = 0  # instead of warmup_s when set (TorchServe warms up with requests / 10)
    arrival: Literal["constant", "poisson"] = "constant"
    steps: int = 4
    engine: str = "async"
    timeout_s: float = 60.0
    protocol: str = "torchserve"  # how requests reach the model (``protocols.PROTOCOLS``)
    early_stop: bool = True
    max_duration_s: float | None = None
    trace: Path | None = None
    trace_format: str | None = None
    trace_options: tuple[tuple[str, str], ...] = ()
    time_scale: float = 1.0
    rate_scale: float = 1.0
    capacity_fraction: float | None = None

    @property
    def longest_s(self) -> float | None:
        """The longest a load run may measure (None: it is counted in requests)."""
        if self.duration_s is None:
            return None
        return max(self.duration_s, self.max_duration_s or 0.0)

    def clients(self, workers: int, batch_size: int) -> int:
        if self.concurrency is not None:
            return self.concurrency
        return max(1, math.ceil(self.factor * workers * batch_size))

    def batch_monotone(self, workers: int, batch_size: int) -> bool:
        """Whether a latency miss at this batch size implies one at every larger size (same workers and delay).

        True under open-loop capacity search and proportional concurrency. With a fixed number of clients larger
        batches can drain a queue faster, so it only holds once the batches can take every client at once.
        """
        return self.concurrency is None or self.mode != "concurrency" or workers * batch_size >= self.concurrency


@dataclass(frozen=True)
class Family:
    """Configs that share one prepared archive: a model archive served with one optimization on one device.

    The tuples are the values searched for each knob; ``threads`` (intra-op threads per worker, model-config
    ``numThreads``) and ``inter_op_threads`` use 0 for the server's automatic choice (an even share of the physical
    cores; torch's default). ``options`` are what a target adds to the family (e.g. on Ray, how many batches a
    replica holds); the target that set them reads them, nothing else does. ``model`` names the model in an app
    study (empty in a single-model study)."""

    label: str
    archive: Path
    optimization: str
    device: str
    workers: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    batch_delays_ms: tuple[int, ...]
    load: Load
    input: Path | None = None
    content_type: str | None = None
    form_field: str | None = None
    gpus: int | None = None  # how many GPUs workers may use (None: all)
    model_config: Mapping[str, Any] = field(default_factory=dict)  # extra model-config.yaml keys for the handler
    options: Mapping[str, Any] = field(default_factory=dict)
    model: str = ""
    threads: tuple[int, ...] = (0,)
    inter_op_threads: tuple[int, ...] = (0,)
    pinning: tuple[bool, ...] = (False,)

    @property
    def size(self) -> int:
        knobs = (
            self.workers,
            self.batch_sizes,
            self.batch_delays_ms,
            self.threads,
            self.inter_op_threads,
            self.pinning,
        )
        return math.prod(len(values) for values in knobs)

    def values(self, knob: str) -> tuple[int, ...]:
        """The values searched for ``knob`` (a :data:`KNOBS` name; pinning as 0/1)."""
        return tuple(int(x) for x in getattr(self, _FAMILY_FIELD.get(knob, knob)))


# The knobs of one model's config, in the order a walk changes them; and the Family field holding each one's values.
KNOBS = ("batch_size", "workers", "batch_delay_ms", "threads", "inter_op_threads", "pinning")
_FAMILY_FIELD = {"batch_size": "batch_sizes", "batch_delay_ms": "batch_delays_ms"}


@dataclass(frozen=True, order=True)
class Config:
    """One model's deployment: a family and the knobs the management API sets (threads 0: automatic)."""

    family: str
    workers: int
    batch_size: int
    batch_delay_ms: int
    threads: int = 0
    inter_op_threads: int = 0
    pinning: bool = False

    @property
    def key(self) -> str:
        key = f"{self.family}|w{self.workers}|b{self.batch_size}|d{self.batch_delay_ms}"
        key += f"|t{self.threads}" if self.threads else ""
        key += f"|i{self.inter_op_threads}" if self.inter_op_threads else ""
        return key + ("|pin" if self.pinning else "")

    @property
    def parts(self) -> tuple[Config, ...]:
        return (self,)

    def knob(self, name: str) -> int:
        return int(getattr(self, name))

    def with_knob(self, name: str, value: int) -> Config:
        changes: dict[str, Any] = {name: bool(value) if name == "pinning" else value}
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        return f"{self.family}, {self.workers} worker(s), batch {self.batch_size}, delay {self.batch_delay_ms} ms"


@dataclass(frozen=True, order=True)
class AppConfig:
    """One point of an app study: every model's config, in the study's model order."""

    parts: tuple[Config, ...]

    @property
    def key(self) -> str:
        return " + ".join(part.key for part in self.parts)


Point = Config | AppConfig


@dataclass(frozen=True)
class ModelSpec:
    """One model of an app study: its name, its default config's family, and its own SLA (on its stage)."""

    name: str
    baseline_family: Family
    sla: Sla = Sla()


@dataclass(frozen=True)
class StrategySpec:
    """The search (``name``), the top candidates it measures once more (``remeasure``), then the ``finalists``
    measured again interleaved, ``rounds`` times each, and compared pairwise before a winner is named
    (``finalists.py``; 0: none)."""

    name: str = "adaptive"
    remeasure: int = 3  # top candidates measured once more at the end
    finalists: int = 2
    rounds: int = 3
    controller: bool = False  # then the winner against the online controller on the study's trace (``online.py``)


@dataclass(frozen=True)
class Contention:
    """A load run during which other processes used ``max_other_cores`` or more (or the client fell behind its
    schedule) is measured again, up to ``retries`` times; the least disturbed run is kept, marked when it was
    still contended (``bench/host.py``)."""

    max_other_cores: float = CONTENDED_CORES
    retries: int = 2


@dataclass(frozen=True)
class Budget:
    seconds: float | None = None
    trials: int | None = None

    def describe(self) -> str:
        parts = ([f"{self.seconds / 60:g} min"] if self.seconds else []) + (
            [f"{self.trials} trials"] if self.trials else []
        )
        return " or ".join(parts) or "none"


@dataclass(frozen=True)
class Study:
    """A validated study. ``backend`` names the target trials run on (``targets.TARGETS``), ``backend_address``
    where it runs (a cluster's address; not part of the fingerprint), ``options`` that backend's own settings."""

    model: str
    families: tuple[Family, ...]
    baseline_family: Family  # the default config's family (eager); may be outside the searched families
    sla: Sla = Sla()
    objective: Objective = Objective()
    strategy: StrategySpec = StrategySpec()
    budget: Budget = Budget()
    server: Mapping[str, str] = field(default_factory=dict)  # extra config.properties for the embedded server
    form: str = "servetune"
    source: Path | None = None
    notes: tuple[str, ...] = ()
    default_config: Config | None = None  # overrides the default config (a server whose batch size is fixed)
    backend: str = "native"
    backend_address: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    models: tuple[ModelSpec, ...] = ()  # an app: several models served together (``families`` holds them all)
    pipeline: tuple[StageSpec, ...] = ()  # an app's call graph (hooks: FILE.py relative to the study's folder)
    mix: tuple[tuple[str, float], ...] = ()  # without a pipeline: each model's share of the app's requests
    # configs measured beside the search and shown beside its winner (e.g. what is deployed today), by label
    references: tuple[tuple[str, Point], ...] = ()
    # an SLA relative to this machine: limit -> multiple of the default config's single-request latency (P50),
    # measured before the first trial (``calibrate.py``); the limit itself is then set in ``sla``
    sla_scale: tuple[tuple[str, float], ...] = ()
    contention: Contention = Contention()
    # families measured outside the space: the winner's with the online controller on (``online.py``)
    extra_families: tuple[Family, ...] = ()

    @property
    def is_app(self) -> bool:
        return bool(self.models)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models) if self.models else (self.model,)

    def families_of(self, model: str) -> tuple[Family, ...]:
        if not self.models:
            return self.families
        return tuple(f for f in self.families if f.model == model)

    def model_spec(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def family(self, label: str) -> Family:
        every = (*self.families, self.baseline_family, *(m.baseline_family for m in self.models), *self.extra_families)
        for family in every:
            if family.label == label:
                return family
        raise KeyError(label)

    @property
    def baseline(self) -> Point:
        """TorchServe's default deployment of every model: 1 worker, batch 1, eager, threads left to the server."""
        if self.default_config is not None:
            return self.default_config
        if self.models:
            return AppConfig(tuple(_default(m.baseline_family) for m in self.models))
        return _default(self.baseline_family)

    @property
    def size(self) -> int:
        if self.models:
            return math.prod(sum(f.size for f in self.families_of(m.name)) for m in self.models)
        return sum(f.size for f in self.families)

    def fingerprint(self) -> str:
        """Changes whenever a measurement could (see ``fingerprint.py``); the budget is left out."""
        from servetune.tune.fingerprint import fingerprint

        return fingerprint(self)


def _default(family: Family) -> Config:
    delays = family.batch_delays_ms
    return Config(family.label, 1, 1, delays[len(delays) // 2])
