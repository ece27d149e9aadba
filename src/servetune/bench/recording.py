"""What an engine hands back (the raw measured samples) and how it becomes a BenchResult.

Engines only record; every figure is computed here, once, so the built-in engine and ``ab`` are summarised alike.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from servetune.bench.host import HostUsage
from servetune.bench.result import BenchResult, ClientUsage, Distribution, Fidelity, LatencySummary, ServerBreakdown
from servetune.bench.slo import slo_figures
from servetune.bench.spec import BenchSpec
from servetune.bench.stats import as_sorted, percentile, quantile_ci, quantile_upper, rate_interval

# Status codes for requests that got no HTTP answer; engines that cannot tell statuses apart record UNKNOWN.
TIMEOUT = -1
CONNECTION = -2
HOOK = -3  # a pipeline's hook failed to make the next request
UNKNOWN = 0
_FAILURE_NAMES = {TIMEOUT: "timeout", CONNECTION: "connection", HOOK: "hook"}

# One call of a pipeline stage: (stage, start s after the pipeline's start, latency ms, status, queue ms, handler ms,
# batch size)
StageCall = tuple[str, float, float, int, float, float, int]

# Open loop: a send later than this after its intended time is late; more than LATE_LIMIT of them -> unreliable.
LATE_MS = 1.0
LATE_LIMIT = 0.01


@dataclass
class Recording:
    """The measured requests, one entry per request in each array (in the order they were answered).

    ``start_s`` is the (intended) send time relative to the start of measurement, ``sent_s`` the actual one (the
    same in the closed loop); ``status`` is the HTTP status,
    ``UNKNOWN`` or a negative failure code; ``queue_ms``/``handler_ms`` are NaN and ``batch_size`` 0 when the
    server did not report them. ``extra_errors`` holds failures an engine counted without per-request statuses.
    In a pipeline each entry is one run of the whole pipeline, and ``stages`` holds each stage's calls.
    """

    start_s: array[float] = field(default_factory=lambda: array("d"))
    latency_ms: array[float] = field(default_factory=lambda: array("d"))
    status: array[int] = field(default_factory=lambda: array("i"))
    queue_ms: array[float] = field(default_factory=lambda: array("d"))
    handler_ms: array[float] = field(default_factory=lambda: array("d"))
    batch_size: array[int] = field(default_factory=lambda: array("i"))
    sent_s: array[float] = field(default_factory=lambda: array("d"))
    window_s: float = 0.0
    cpu_seconds: float = 0.0
    extra_errors: Counter[str] = field(default_factory=Counter)
    scheduled: int = 0
    late_sends: int = 0
    max_late_ms: float = 0.0
    peak_in_flight: int = 0
    resolution_ms: float | None = None
    warnings: list[str] = field(default_factory=list)
    stages: dict[str, Recording] = field(default_factory=dict)

    def add(
        self,
        start_s: float,
        latency_ms: float,
        status: int,
        queue_ms: float,
        handler_ms: float,
        batch_size: int,
        calls: tuple[StageCall, ...] = (),
        sent_s: float | None = None,
    ) -> None:
        self.start_s.append(start_s)
        self.sent_s.append(start_s if sent_s is None else sent_s)
        self.latency_ms.append(latency_ms)
        self.status.append(status)
        self.queue_ms.append(queue_ms)
        self.handler_ms.append(handler_ms)
        self.batch_size.append(batch_size)
        for stage, offset, latency, code, queue, handler, batch in calls:
            self.stages.setdefault(stage, Recording()).add(start_s + offset, latency, code, queue, handler, batch)


def summarise_latency(latency_ms: np.ndarray) -> LatencySummary | None:  # type: ignore[type-arg]
    if len(latency_ms) == 0:
        return None
    ordered = as_sorted(latency_ms)
    p99 = percentile(ordered, 99.0)
    ci = quantile_ci(ordered, 0.99)
    upper = quantile_upper(ordered, 0.99)
    return LatencySummary(
        count=len(ordered),
        mean_ms=float(ordered.mean()),
        min_ms=float(ordered[0]),
        max_ms=float(ordered[-1]),
        p50_ms=percentile(ordered, 50.0),
        p90_ms=percentile(ordered, 90.0),
        p95_ms=percentile(ordered, 95.0),
        p99_ms=p99,
        p999_ms=percentile(ordered, 99.9),
        at_or_above_p99=int(len(ordered) - np.searchsorted(ordered, p99, side="left")),
        p99_ci_low_ms=ci[0] if ci else None,
        p99_ci_high_ms=ci[1] if ci else None,
        p99_upper_ms=upper,
    )


def _distribution(values: np.ndarray) -> Distribution | None:  # type: ignore[type-arg]
    if len(values) == 0:
        return None
    ordered = as_sorted(values)
    return Distribution(
        mean_ms=float(ordered.mean()),
        p50_ms=percentile(ordered, 50.0),
        p90_ms=percentile(ordered, 90.0),
        p99_ms=percentile(ordered, 99.0),
    )


def header_breakdown(rec: Recording, ok: np.ndarray) -> ServerBreakdown | None:  # type: ignore[type-arg]
    """Per-request server breakdown from the timing headers of the successful responses, if the server sent any."""
    queue = np.frombuffer(rec.queue_ms, dtype=np.float64)[ok]
    handler = np.frombuffer(rec.handler_ms, dtype=np.float64)[ok]
    batch = np.frombuffer(rec.batch_size, dtype=np.int32)[ok]
    queue, handler, batch = queue[~np.isnan(queue)], handler[~np.isnan(handler)], batch[batch > 0]
    if not (len(queue) or len(handler) or len(batch)):
        return None
    # Each request reports the size b of its batch; a batch of b answers b requests, so the per-batch mean is the
    # harmonic mean of what the requests saw.
    batch_mean = float(len(batch) / np.sum(1.0 / batch)) if len(batch) else None
    return ServerBreakdown(
        source="headers",
        requests=int(max(len(queue), len(handler), len(batch))),
        queue=_distribution(queue),
        handler=_distribution(handler),
        batch_size_mean=batch_mean,
    )


def fidelity(rec: Recording) -> Fidelity | None:
    """How closely an open-loop run kept its schedule (None in the closed loop)."""
    if not rec.scheduled or not len(rec.start_s):
        return None
    intended = np.frombuffer(rec.start_s, dtype=np.float64)
    sent = np.frombuffer(rec.sent_s, dtype=np.float64)
    slip = np.sort((sent - intended) * 1e3)
    bins = int(math.floor(float(intended.max()))) + 1
    expected = np.bincount(np.clip(np.floor(intended), 0, bins - 1).astype(np.int64), minlength=bins)
    index = np.floor(sent).astype(np.int64)
    actual = np.bincount(np.clip(index[index < bins], 0, bins - 1), minlength=bins)
    compared = expected >= 10
    deviation = np.where(compared, np.abs(actual - expected) / np.maximum(expected, 1), 0.0)
    worst = int(np.argmax(deviation)) if compared.any() else 0
    return Fidelity(
        slip_p50_ms=round(percentile(slip, 50.0), 4),
        slip_p99_ms=round(percentile(slip, 99.0), 4),
        slip_max_ms=round(float(slip[-1]), 4),
        second_deviation=round(float(deviation[worst]), 5) if compared.any() else 0.0,
        worst_second=worst,
        seconds=int(compared.sum()),
    )


def summarise(
    spec: BenchSpec,
    rec: Recording,
    started_at: datetime,
    metrics_breakdown: ServerBreakdown | None = None,
    engine_warnings: list[str] | None = None,
    host: HostUsage | None = None,
) -> BenchResult:
    status = np.frombuffer(rec.status, dtype=np.int32)
    ok = ((status >= 200) & (status < 300)) | (status == UNKNOWN)
    errors: Counter[str] = Counter(rec.extra_errors)
    for code, count in zip(*np.unique(status[~ok], return_counts=True), strict=True):
        errors[_FAILURE_NAMES.get(int(code), str(int(code)))] += int(count)
    # An engine without per-request statuses (ab) records every answer as UNKNOWN and counts failures apart.
    succeeded = max(0, int(ok.sum()) - sum(rec.extra_errors.values()))
    start = np.frombuffer(rec.start_s, dtype=np.float64)
    latency_ms = np.frombuffer(rec.latency_ms, dtype=np.float64)
    latency = summarise_latency(latency_ms[ok])
    interval = (
        rate_interval(start[ok] + latency_ms[ok] / 1e3, 0.0, rec.window_s) if succeeded == int(ok.sum()) else None
    )
    slo = None
    if spec.slo is not None and not spec.slo.empty:
        slo = slo_figures(spec.slo, start, latency_ms, ok, spec.window_s, rec.window_s)
    server = header_breakdown(rec, ok) or metrics_breakdown
    client = ClientUsage(
        cpu_seconds=rec.cpu_seconds,
        wall_seconds=rec.window_s,
        cpu_percent=100.0 * rec.cpu_seconds / rec.window_s if rec.window_s > 0 else 0.0,
    )
    reasons: list[str] = []
    warnings = list(engine_warnings or []) + rec.warnings
    if rec.scheduled and rec.late_sends > LATE_LIMIT * rec.scheduled:
        reasons.append(
            f"the client fell behind its schedule: {rec.late_sends} of {rec.scheduled} sends "
            f"({100.0 * rec.late_sends / rec.scheduled:.1f}%) left more than {LATE_MS:g} ms late "
            f"(worst {rec.max_late_ms:.1f} ms)"
        )
    if client.bottleneck:
        warnings.append(
            f"the client used {client.cpu_percent:.0f}% of one core: the load generator, not the server, "
            "may be the bottleneck"
        )
    kept = fidelity(rec)
    if host is not None and host.contended:
        warnings.append(f"other processes used the machine while it was measured: {host.describe()}")
    if server is None and spec.metrics_url is None:
        warnings.append("no server breakdown: no X-Servetune-* headers in the responses and no metrics URL given")
    if not ok.any():
        warnings.append("no request succeeded: latency figures are absent")
    stages = {}
    for name, calls in rec.stages.items():
        calls.window_s = rec.window_s
        stage = next(s for s in spec.stages if s.model == name)
        labels = {**spec.labels, "model": name}
        stage_spec = dataclasses.replace(spec, url=spec.stage_url(stage), stages=(), labels=labels)
        stages[name] = summarise(dataclasses.replace(stage_spec, slo=None), calls, started_at)
    return BenchResult(
        engine=spec.engine,
        url=spec.url,
        mode=spec.mode,
        concurrency=spec.clients if spec.mode == "closed" else None,
        rate=spec.rate if spec.schedule is None else round(rec.scheduled / rec.window_s, 3) if rec.window_s else None,
        arrival=spec.arrival if spec.mode == "open" and spec.schedule is None else None,
        started_at=started_at.isoformat(timespec="seconds"),
        duration_s=rec.window_s,
        sent=len(status),
        succeeded=succeeded,
        errors=dict(sorted(errors.items())),
        throughput_rps=succeeded / rec.window_s if rec.window_s > 0 else 0.0,
        latency=latency,
        server=server,
        client=client,
        late_sends=rec.late_sends,
        max_late_ms=rec.max_late_ms,
        peak_in_flight=rec.peak_in_flight,
        unreliable=bool(reasons),
        reasons=reasons,
        warnings=warnings,
        input=str(spec.input) if spec.input is not None else None,
        requests=spec.requests,
        duration=spec.duration,
        labels={"model": spec.model, **spec.labels} if spec.model else dict(spec.labels),
        latency_resolution_ms=rec.resolution_ms,
        stages=stages,
        samples=rec,
        throughput_low_rps=None if interval is None else round(interval[0], 3),
        throughput_high_rps=None if interval is None else round(interval[1], 3),
        schedule=spec.schedule.name if spec.schedule is not None else None,
        slo=slo,
        fidelity=kept,
        host=host,
    )
