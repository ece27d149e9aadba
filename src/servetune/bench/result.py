"""The result of one load run: what the tuner reads, what reports render, what result.json holds."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from servetune.bench.host import HostUsage
from servetune.bench.slo import Slo, SloFigures, Window

if TYPE_CHECKING:
    from servetune.bench.recording import Recording

# Share of one core above which the client, not the server, may be what limits the run.
CLIENT_BOTTLENECK_PERCENT = 85.0


@dataclass(frozen=True)
class LatencySummary:
    """Latency of the measured successful requests, in ms, from the exact sample set.

    ``at_or_above_p99`` counts the samples >= P99; ``p99_ci_*`` is a distribution-free confidence interval for the
    true P99 (``None`` when there are too few samples for one: at 95% that needs about 370); ``p99_upper_ms`` a
    one-sided upper bound at the same confidence (from 299 samples): the true P99 is below it.
    """

    count: int
    mean_ms: float
    min_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    at_or_above_p99: int
    p99_ci_low_ms: float | None = None
    p99_ci_high_ms: float | None = None
    ci_confidence: float = 0.95
    p99_upper_ms: float | None = None


@dataclass(frozen=True)
class Distribution:
    """Mean and percentiles (ms) of one server-side component; percentiles are None when only a mean is known."""

    mean_ms: float
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None


@dataclass(frozen=True)
class ServerBreakdown:
    """Where the time went inside the server.

    ``source`` is ``"headers"`` (per request, from X-Servetune-* response headers) or ``"metrics"`` (deltas of the
    server's /metrics across the measured run; other traffic to the same model is counted too).
    ``batch_size_mean`` is the mean size of the batches the measured requests ran in (averaged per batch).
    ``total`` is the server's own receive-to-response time, when the source reports it.
    """

    source: str
    requests: int
    queue: Distribution | None = None
    handler: Distribution | None = None
    total: Distribution | None = None
    batch_size_mean: float | None = None


@dataclass(frozen=True)
class ClientUsage:
    """CPU the load generator itself used during the measured run (``cpu_percent`` is of one core)."""

    cpu_seconds: float
    wall_seconds: float
    cpu_percent: float

    @property
    def bottleneck(self) -> bool:
        return self.cpu_percent > CLIENT_BOTTLENECK_PERCENT


@dataclass(frozen=True)
class Fidelity:
    """How closely an open-loop run kept its schedule. ``slip`` is each measured send's actual time minus its
    intended one (ms; negative: it left early); ``second_deviation`` the largest relative difference between the
    sends made and the sends scheduled in one second of the run (seconds with at least 10 scheduled), at
    ``worst_second``."""

    slip_p50_ms: float
    slip_p99_ms: float
    slip_max_ms: float
    second_deviation: float
    worst_second: int
    seconds: int

    def describe(self) -> str:
        return (
            f"slip p50 {self.slip_p50_ms:.3f} ms, p99 {self.slip_p99_ms:.3f} ms, max {self.slip_max_ms:.1f} ms; "
            f"per-second sends within {100 * self.second_deviation:.2f}% of the schedule over {self.seconds} s"
        )


@dataclass(frozen=True)
class BenchResult:
    """Everything one run measured. Counts and figures cover the measured requests only (never the warm-up)."""

    engine: str
    url: str
    mode: str
    concurrency: int | None
    rate: float | None
    arrival: str | None
    started_at: str
    duration_s: float
    sent: int
    succeeded: int
    errors: dict[str, int]
    throughput_rps: float
    latency: LatencySummary | None
    server: ServerBreakdown | None
    client: ClientUsage
    late_sends: int = 0
    max_late_ms: float = 0.0
    peak_in_flight: int = 0
    unreliable: bool = False
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    input: str | None = None
    requests: int | None = None
    duration: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    latency_resolution_ms: float | None = None
    # A pipeline: each stage's figures (its model's calls), by model name; the figures above are end to end.
    stages: dict[str, BenchResult] = field(default_factory=dict)
    # 95% interval for the throughput, from sub-windows of the run (None: too short or too few requests)
    throughput_low_rps: float | None = None
    throughput_high_rps: float | None = None
    schedule: str | None = None  # the open loop's schedule (a trace, a shape, a rate)
    slo: SloFigures | None = None  # goodput, attainment and windows, when an SLO was given
    fidelity: Fidelity | None = None  # open loop: how closely the schedule was kept
    host: HostUsage | None = None  # the machine's CPU while measuring: interference
    # The per-request samples behind the figures (for plots and samples.csv); kept in memory, not serialised.
    samples: Recording | None = field(default=None, repr=False, compare=False)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def contended(self) -> bool:
        """Other processes used the machine beyond the threshold while this run was measured."""
        return self.host is not None and self.host.contended

    @property
    def error_rate(self) -> float:
        """Failed requests as a fraction of measured requests sent (0..1)."""
        return self.failed / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "stages":
                data[f.name] = {name: stage.to_dict() for name, stage in value.items()}
            elif f.name != "samples":
                if is_dataclass(value) and not isinstance(value, type):
                    value = asdict(value)
                elif isinstance(value, (dict, list)):
                    value = value.copy()
                data[f.name] = value
        data["error_rate"] = self.error_rate
        data["client"]["bottleneck"] = self.client.bottleneck
        if self.host is not None:
            data["host"]["contended"] = self.host.contended
        if self.slo is not None:
            data["slo"]["windows_inside"] = self.slo.windows_inside
            data["slo"]["windows_share"] = self.slo.windows_share
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        data = dict(data)
        data.pop("error_rate", None)
        client = dict(data["client"])
        client.pop("bottleneck", None)
        data["client"] = ClientUsage(**client)
        if data.get("latency") is not None:
            data["latency"] = LatencySummary(**data["latency"])
        if data.get("server") is not None:
            server = dict(data["server"])
            for key in ("queue", "handler", "total"):
                if server.get(key) is not None:
                    server[key] = Distribution(**server[key])
            data["server"] = ServerBreakdown(**server)
        data["stages"] = {name: cls.from_dict(stage) for name, stage in (data.get("stages") or {}).items()}
        if data.get("fidelity") is not None:
            data["fidelity"] = Fidelity(**data["fidelity"])
        if data.get("host") is not None:
            host = dict(data["host"])
            host.pop("contended", None)
            data["host"] = HostUsage(**host)
        if data.get("slo") is not None:
            slo = dict(data["slo"])
            slo.pop("windows_inside", None)
            slo.pop("windows_share", None)
            slo["slo"] = Slo(**slo["slo"])
            slo["windows"] = [Window(**w) for w in slo.get("windows", ())]
            data["slo"] = SloFigures(**slo)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> BenchResult:
        loaded: dict[str, Any] = json.loads(text)
        return cls.from_dict(loaded)
