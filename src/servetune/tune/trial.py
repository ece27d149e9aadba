"""What one trial measured, how it is judged against the SLA, and how repeats of a config combine."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from servetune.bench.result import BenchResult
from servetune.tune.study import AppConfig, Config, Point, Sla, Study

LATENCY_KEYS = ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms")


@dataclass(frozen=True)
class Probe:
    """One load run of a capacity search: closed-loop saturation (``rate`` None) or an open-loop rate."""

    rate: float | None
    concurrency: int | None
    throughput_rps: float
    p99_ms: float | None
    error_rate: float
    passed: bool


@dataclass(frozen=True)
class Attempt:
    """One load run of a trial, kept or not: a run during which other processes used the machine beyond the study's
    threshold (``contended``), or whose client fell behind its schedule (``unreliable``), is measured again."""

    throughput_rps: float
    p99_ms: float | None
    others_cores: float | None
    steal_cores: float | None
    contended: bool
    unreliable: bool
    kept: bool

    @classmethod
    def of(cls, result: BenchResult, *, kept: bool) -> Attempt:
        host = result.host
        return cls(
            throughput_rps=round(result.throughput_rps, 3),
            p99_ms=round(result.latency.p99_ms, 3) if result.latency else None,
            others_cores=host.others_cores if host else None,
            steal_cores=host.steal_cores if host else None,
            contended=result.contended,
            unreliable=result.unreliable,
            kept=kept,
        )


@dataclass(frozen=True)
class Trial:
    """One measurement of one config. ``repeat`` counts earlier measurements of the same config in this study.

    ``result`` is the load run the figures come from: the only run under fixed concurrency; under capacity search
    the highest rate that met the SLA (or, if none did, the lowest rate tried). ``status`` is ``error`` when the
    config could not be served or measured at all (``error`` says why).
    """

    index: int
    config: Point
    repeat: int
    status: str
    result: BenchResult | None = None
    error: str = ""
    probes: tuple[Probe, ...] = ()
    capacity_rps: float | None = None
    memory_bytes: int = 0  # the workers' resident memory, summed
    gpu_memory_bytes: int = 0  # the workers' peak CUDA memory, summed (servetune servers only)
    setup_s: float = 0.0
    wall_s: float = 0.0
    started_at: str = ""
    reason: str = ""
    load: Mapping[str, Any] = field(default_factory=dict)  # {"concurrency": N} or {"rate": R, "arrival": ...}
    # model -> its workers as they reported themselves (pid, numThreads, interOpThreads, cpuCores), when a thread
    # or pinning knob was set
    placement: Mapping[str, Any] = field(default_factory=dict)
    attempts: tuple[Attempt, ...] = ()  # every load run of the trial, kept or measured again
    phase: str = ""  # "finalist": a round of the finalists' interleaved re-measure

    @property
    def key(self) -> tuple[str, int]:
        return self.config.key, self.repeat

    @property
    def contended(self) -> bool:
        """The figures kept were measured while other processes used the machine beyond the threshold (every retry
        was contended too)."""
        return self.result is not None and self.result.contended

    @property
    def remeasured(self) -> int:
        """How many load runs were measured again because of contention or an unpunctual client."""
        return sum(1 for a in self.attempts if not a.kept)

    def interference(self) -> str:
        """Other processes' CPU while the kept figures were measured, for reports ("0.12 cores", "contended: ...")."""
        host = self.result.host if self.result is not None else None
        if host is None:
            return ""
        text = f"{host.others_cores:.2f} cores" + (f" + steal {host.steal_cores:.2f}" if host.steal_cores else "")
        if self.contended:
            text = "contended: " + text
        if self.remeasured:
            text += f" ({self.remeasured} run{'s' if self.remeasured > 1 else ''} measured again)"
        return text

    def figures(self) -> Figures | None:
        return figures_of(self.result) if self.status == "ok" else None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("result", "probes", "attempts")}
        data["config"] = asdict(self.config)
        data["result"] = self.result.to_dict() if self.result is not None else None
        data["probes"] = [asdict(p) for p in self.probes]
        data["attempts"] = [asdict(a) for a in self.attempts]
        data["load"] = dict(self.load)
        data["placement"] = {name: [dict(w) for w in workers] for name, workers in self.placement.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        values = dict(data)
        raw = values["config"]
        values["config"] = (
            AppConfig(tuple(Config(**part) for part in raw["parts"])) if "parts" in raw else Config(**raw)
        )
        values["result"] = BenchResult.from_dict(values["result"]) if values.get("result") else None
        values["probes"] = tuple(Probe(**p) for p in values.get("probes", ()))
        values["attempts"] = tuple(Attempt(**a) for a in values.get("attempts", ()))
        return cls(**values)


@dataclass(frozen=True)
class Figures:
    """What a verdict is made from: throughput, latency (end to end in a pipeline), errors, and in an app each
    model's own figures (its stage of the pipeline, or its stream of the mix)."""

    throughput_rps: float
    latency: Mapping[str, float]
    error_rate: float
    stages: Mapping[str, Figures] = field(default_factory=dict)


def figures_of(result: BenchResult | None) -> Figures | None:
    """The figures a verdict is made from; None without a single successful request."""
    if result is None or result.latency is None:
        return None
    lat = result.latency
    stages = {name: f for name, stage in result.stages.items() if (f := figures_of(stage)) is not None}
    return Figures(result.throughput_rps, {k: getattr(lat, k) for k in LATENCY_KEYS}, result.error_rate, stages)


@dataclass(frozen=True)
class Verdict:
    """``score`` orders configs: the objective when the SLA is met, else minus how far it was missed.
    ``typical_miss``: even the median request is over a latency limit (a miss that noise in the tail cannot explain)."""

    passed: bool
    latency_ok: bool
    typical_miss: bool
    violation: float
    objective: float
    score: float
    reason: str


def judge(figures: Figures | None, config: Point, study: Study) -> Verdict:
    """Against the study's SLA (end to end in a pipeline) and, in an app, each model's own SLA on its figures."""
    if figures is None:
        return Verdict(False, False, False, math.inf, 0.0, -math.inf, "no measurement")
    checks: list[tuple[str, Sla, Figures | None]] = [("", study.sla, figures)]
    checks += [(f"{m.name} ", m.sla, figures.stages.get(m.name)) for m in study.models if not m.sla.empty]
    misses: list[str] = []
    violation = 0.0
    typical_miss = False
    for who, sla, measured in checks:
        if measured is None:
            misses.append(f"{who}not measured")
            violation = math.inf
            continue
        for key, limit in sla.limits():
            value = measured.latency[key]
            violation = max(violation, value / limit - 1.0)
            if value > limit:
                misses.append(f"{who}{key.removesuffix('_ms').upper()} {value:.1f} ms > {limit:g} ms")
        typical_miss |= any(measured.latency["p50_ms"] > limit for _, limit in sla.limits())
    latency_ok = not misses
    if figures.error_rate > study.sla.max_error_rate:
        misses.append(f"errors {100 * figures.error_rate:.2f}% > {100 * study.sla.max_error_rate:g}%")
        violation = max(violation, figures.error_rate - study.sla.max_error_rate)
    passed = not misses
    objective = 0.0
    if passed:
        device = study.family(config.parts[0].family).device
        objective = figures.throughput_rps if study.is_app else study.objective.value(figures.throughput_rps, device)
    score = objective if passed else -violation
    return Verdict(passed, latency_ok, typical_miss, violation, objective, score, "; ".join(misses))


@dataclass(frozen=True)
class Summary:
    """A config's trials combined (``combine``: the mean of its runs measured in peace), judged once on that."""

    config: Point
    trials: tuple[Trial, ...]
    figures: Figures | None
    verdict: Verdict
    memory_bytes: int
    gpu_memory_bytes: int = 0

    @property
    def throughput_rps(self) -> float:
        return self.figures.throughput_rps if self.figures else 0.0

    def latency(self, key: str = "p99_ms") -> float | None:
        return self.figures.latency[key] if self.figures else None

    @property
    def error(self) -> str:
        return next((t.error for t in self.trials if t.status == "error"), "")


def average(measured: list[Figures]) -> Figures:
    """Repeats of a config combined: every figure (each stage's too) the mean of its runs."""
    n = len(measured)
    names = [name for name in measured[0].stages if all(name in f.stages for f in measured)]
    return Figures(
        sum(f.throughput_rps for f in measured) / n,
        {k: sum(f.latency[k] for f in measured) / n for k in LATENCY_KEYS},
        sum(f.error_rate for f in measured) / n,
        {name: average([f.stages[name] for f in measured]) for name in names},
    )


def combine(config: Point, own: Iterable[Trial], study: Study) -> Figures | None:
    """A config's runs combined: the mean of those measured in peace, contended runs left out (other processes only
    add latency and take throughput); when every run was contended, the least disturbed one: the run judged best."""
    runs = [(t.contended, f) for t in own if (f := t.figures()) is not None]
    clean = [f for contended, f in runs if not contended]
    if clean:
        return average(clean)
    if not runs:
        return None
    return max((f for _, f in runs), key=lambda f: (judge(f, config, study).score, f.throughput_rps))


def summarise(config: Point, trials: Iterable[Trial], study: Study) -> Summary:
    own = tuple(t for t in trials if t.config == config)
    figures = combine(config, own, study)
    memory = max((t.memory_bytes for t in own), default=0)
    gpu_memory = max((t.gpu_memory_bytes for t in own), default=0)
    return Summary(config, own, figures, judge(figures, config, study), memory, gpu_memory)


def summarise_all(trials: Iterable[Trial], study: Study) -> list[Summary]:
    """One summary per config, best score first."""
    trials = list(trials)
    configs = list(dict.fromkeys(t.config for t in trials))
    summaries = [summarise(c, trials, study) for c in configs]
    return sorted(summaries, key=lambda s: (-s.verdict.score, -s.throughput_rps, s.config))
