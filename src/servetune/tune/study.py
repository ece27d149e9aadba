"""A tuning study, validated: what to serve, the space of deployments to try, how to load them, what must hold.

Two YAML forms become the same :class:`Study` (see :func:`load_study`): servetune's own (``native.py``) and
TorchServe's auto-benchmark model config (``torchserve.py``). Everything is checked here, before any trial runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from servetune._exceptions import ConfigError

FINGERPRINT_VERSION = 1
RAY_ONGOING_BATCHES = (1, 2)  # searched on Ray unless the study says otherwise
DEVICES = ("cpu", "cuda")
BACKENDS = ("native", "ray")
BACKEND_KEYS = ("backend", "ray_address")  # servetune's form only; read here, for every trial's server
_RAY_ADDRESS = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$")


@dataclass(frozen=True)
class Sla:
    """Latency limits (ms) a config must meet, and the share of failed requests it may have."""

    p99_ms: float | None = None
    p95_ms: float | None = None
    mean_ms: float | None = None
    max_error_rate: float = 0.001

    def limits(self) -> list[tuple[str, float]]:
        """``(LatencySummary attribute, limit)`` for every limit set."""
        return [(name, value) for name in ("p99_ms", "p95_ms", "mean_ms") if (value := getattr(self, name)) is not None]

    @property
    def empty(self) -> bool:
        return not self.limits()

    def describe(self) -> str:
        if self.empty:
            return "no latency SLA"
        return ", ".join(f"{_LABEL[name]} <= {value:g} ms" for name, value in self.limits())


_LABEL = {"p99_ms": "P99", "p95_ms": "P95", "mean_ms": "mean"}


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
    """

    mode: Literal["concurrency", "capacity"] = "concurrency"
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

    def clients(self, workers: int, batch_size: int) -> int:
        if self.concurrency is not None:
            return self.concurrency
        return max(1, math.ceil(self.factor * workers * batch_size))

    def batch_monotone(self, workers: int, batch_size: int) -> bool:
        """Whether a latency miss at this batch size implies one at every larger size (same workers and delay).

        True under open-loop capacity search and proportional concurrency. With a fixed number of clients larger
        batches can drain a queue faster, so it only holds once the batches can take every client at once.
        """
        return self.concurrency is None or self.mode == "capacity" or workers * batch_size >= self.concurrency


@dataclass(frozen=True)
class Family:
    """Configs that share one prepared archive: a model archive served with one optimization on one device."""

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
    ongoing_batches: int | None = None  # backend ray: batches a replica holds (rayOngoingBatches); None: the default

    @property
    def size(self) -> int:
        return len(self.workers) * len(self.batch_sizes) * len(self.batch_delays_ms)


@dataclass(frozen=True, order=True)
class Config:
    """One point of the space: a family and the three knobs the management API sets."""

    family: str
    workers: int
    batch_size: int
    batch_delay_ms: int

    @property
    def key(self) -> str:
        return f"{self.family}|w{self.workers}|b{self.batch_size}|d{self.batch_delay_ms}"

    def describe(self) -> str:
        return f"{self.family}, {self.workers} worker(s), batch {self.batch_size}, delay {self.batch_delay_ms} ms"


@dataclass(frozen=True)
class StrategySpec:
    name: str = "adaptive"
    remeasure: int = 3  # top candidates measured once more at the end


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
    backend: str = "native"  # the server trials run on: servetune's own, or Ray Serve (servetune serve --backend ray)
    ray_address: str | None = None  # backend ray: a running cluster (HOST:PORT or auto); None: a private local one
    ray_ongoing_batches: tuple[int, ...] = ()  # space.ray_ongoing_batches; () searches RAY_ONGOING_BATCHES on Ray

    def family(self, label: str) -> Family:
        for family in (*self.families, self.baseline_family):
            if family.label == label:
                return family
        raise KeyError(label)

    @property
    def baseline(self) -> Config:
        """TorchServe's default deployment: 1 worker, batch 1, eager."""
        if self.default_config is not None:
            return self.default_config
        delays = self.baseline_family.batch_delays_ms
        return Config(self.baseline_family.label, 1, 1, delays[len(delays) // 2])

    @property
    def size(self) -> int:
        return sum(f.size for f in self.families)

    def fingerprint(self) -> str:
        """Changes whenever a measurement could: the space, load, SLA, objective, strategy, archive and inputs.
        The budget is left out, so a study can be resumed with more of it."""
        data = dataclasses.asdict(self)
        for key in ("budget", "notes", "source", "ray_address"):  # a cluster's address may change between runs
            data.pop(key)
        if self.backend == "native":  # as before the key existed: older checkpoints still resume
            data.pop("backend")
        if not self.ray_ongoing_batches:  # likewise
            data.pop("ray_ongoing_batches")
        for family in (*data["families"], data["baseline_family"]):
            if family["ongoing_batches"] is None:
                family.pop("ongoing_batches")
        digests = {str(f.archive): _digest(f.archive) for f in (*self.families, self.baseline_family)}
        digests.update({str(f.input): _digest(f.input) for f in self.families if f.input is not None})
        payload = json.dumps([FINGERPRINT_VERSION, data, digests], sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def for_backend(self) -> Study:
        """The study as its backend runs it. On Ray, how many batches a replica holds is a knob of its own (Ray's
        router may queue a batch behind a busy replica while another idles; holding two keeps a busy one fed): each
        family is searched with every value of ``space.ray_ongoing_batches`` (default 1 and 2) unless the study's
        model_config sets ``rayOngoingBatches``. The default config keeps the server's default (2)."""
        from servetune.ray.plan import ONGOING_BATCHES

        if self.backend != "ray":
            if not self.ray_ongoing_batches:
                return self
            note = "space.ray_ongoing_batches ignored: the native server's workers take one batch at a time"
            return dataclasses.replace(self, ray_ongoing_batches=(), notes=(*self.notes, note))
        if any(f.ongoing_batches is not None for f in self.families):
            return self  # already expanded
        if any("rayOngoingBatches" in f.model_config for f in self.families):
            return self  # set by hand
        values = self.ray_ongoing_batches or RAY_ONGOING_BATCHES

        def held(family: Family, n: int) -> Family:
            return dataclasses.replace(family, label=f"{family.label}/q{n}", ongoing_batches=n)

        families = tuple(held(f, n) for f in self.families for n in values)
        baseline = self.baseline_family
        if ONGOING_BATCHES in values:
            baseline = held(baseline, ONGOING_BATCHES)
        return dataclasses.replace(self, families=families, baseline_family=baseline)

    def with_overrides(
        self,
        *,
        sla_p99_ms: float | None = None,
        budget_s: float | None = None,
        strategy: str | None = None,
        backend: str | None = None,
        ray_address: str | None = None,
    ) -> Study:
        """The study with command-line overrides applied (CLI > file)."""
        study = self
        if backend is not None:  # --backend native leaves the study's cluster address unused
            study = dataclasses.replace(
                study, backend=backend, ray_address=None if backend == "native" else study.ray_address
            )
        if ray_address is not None:
            study = dataclasses.replace(study, ray_address=ray_address)
        if sla_p99_ms is not None:
            study = dataclasses.replace(study, sla=dataclasses.replace(study.sla, p99_ms=sla_p99_ms))
        if budget_s is not None:
            study = dataclasses.replace(study, budget=dataclasses.replace(study.budget, seconds=budget_s))
        if strategy is not None:
            from servetune.tune.strategies import STRATEGIES

            if strategy not in STRATEGIES:
                raise ConfigError(f"strategy={strategy!r}: expected one of {', '.join(STRATEGIES)}")
            study = dataclasses.replace(study, strategy=dataclasses.replace(study.strategy, name=strategy))
        study.validate()
        return study

    def validate(self) -> None:
        """Checks that span sections (each section checks itself as it is read)."""
        check_backend(self)
        if any(f.load.mode == "capacity" for f in self.families) and self.sla.empty:
            raise ConfigError("load=capacity needs a latency SLA (sla.p99_ms, p95_ms or mean_ms, or --sla-p99)")
        if self.objective.kind == "cost":
            priced = dict(self.objective.prices)
            for family in self.families:
                if family.device not in priced:
                    raise ConfigError(f"objective.cost: no price for device {family.device!r} (space.devices lists it)")


def check_backend(study: Study) -> None:
    """``backend`` and ``ray_address``: known values, Ray only for servetune's form, and Ray installed."""
    if study.backend not in BACKENDS:
        raise ConfigError(f"backend={study.backend!r}: expected {' or '.join(BACKENDS)}")
    if study.ray_address is not None:
        match = _RAY_ADDRESS.match(study.ray_address)
        if study.ray_address != "auto" and (match is None or not 0 < int(match.group(1)) < 65536):
            raise ConfigError(
                f"ray_address={study.ray_address!r}: expected HOST:PORT of a running Ray cluster's head "
                "(its GCS port, 6379 by default), or auto"
            )
        if study.backend != "ray":
            raise ConfigError(f"ray_address={study.ray_address!r}: only used with backend ray (backend is native)")
    if study.backend != "ray":
        return
    if study.form != "servetune":
        raise ConfigError(
            "backend='ray': TorchServe's auto-benchmark form runs on the native server; "
            "write a servetune study (docs/tune.md) to tune on Ray"
        )
    from servetune.config.server import ServerConfig
    from servetune.ray import require_ray
    from servetune.ray.backend import check_config

    try:
        check_config(ServerConfig.from_properties(dict(study.server)))
    except ConfigError as exc:
        raise ConfigError(f"server: {exc}") from None
    require_ray()


def _digest(path: Path) -> str:
    """Content digest of a file; for a directory, of its file names, sizes and modification times."""
    if path.is_file():
        h = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    if path.is_dir():
        entries = sorted(
            (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()
        )
        return hashlib.sha256(json.dumps(entries).encode()).hexdigest()
    return "missing"


def host_devices() -> set[str]:
    """The devices this host can serve on (CUDA counted the way the server counts GPUs)."""
    from servetune.hardware import detect_gpus

    return {"cpu", "cuda"} if detect_gpus() > 0 else {"cpu"}


def load_study(path: Path, *, devices: set[str] | None = None) -> Study:
    """Read and validate a study file in either form; raises ConfigError naming the key and value at fault."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"study file {str(path)!r}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"study file {str(path)!r}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"study file {str(path)!r}: expected a mapping at the top level")
    available = host_devices() if devices is None else devices
    from servetune.tune import native, torchserve

    if native.looks_like(raw):
        backend = {key: raw[key] for key in BACKEND_KEYS if key in raw}
        study: Study = native.parse({k: v for k, v in raw.items() if k not in BACKEND_KEYS}, path, available)
        values = _backend(backend)
        study = dataclasses.replace(
            study, backend=values.get("backend", "native"), ray_address=values.get("ray_address")
        )
    else:
        study = torchserve.parse(raw, path, available)
    study.validate()
    return study


def _backend(raw: Mapping[str, Any]) -> dict[str, str]:
    """The study file's ``backend`` (default native) and ``ray_address``, type-checked (values in ``validate``)."""
    out: dict[str, str] = {}
    for key in BACKEND_KEYS:
        if key in raw:
            value = raw[key]
            if not isinstance(value, str) or not value.strip():
                expected = "native or ray" if key == "backend" else "HOST:PORT of a running Ray cluster, or auto"
                raise ConfigError(f"{key}={value!r}: expected {expected}")
            out[key] = value.strip()
    return out
