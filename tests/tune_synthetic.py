"""Trials from a closed-form performance model, for testing strategies, reports and checkpoints without a server.

The measurements are made up by formula; the strategies, analysis and reports that read them are the real code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from servetune.bench.host import HostUsage
from servetune.bench.result import BenchResult, ClientUsage, Distribution, LatencySummary, ServerBreakdown
from servetune.tune.space import Space
from servetune.tune.strategies import Proposal, load_strategy
from servetune.tune.study import Config, Family, Load, Sla, StrategySpec, Study
from servetune.tune.trial import Trial
from tune_models import expected_closed_loop

# config -> (throughput, p99[, p50]) or None when it cannot serve; P50 is 0.8 x P99 unless given
Model = Callable[[Config], tuple[float, ...] | None]


def result(
    throughput: float,
    p99: float,
    *,
    p50: float | None = None,
    errors: int = 0,
    sent: int = 1000,
    config: Config | None = None,
    handler_ms: float | None = None,
    others_cores: float | None = None,
) -> BenchResult:
    """A made-up load run; ``handler_ms``: the server's handler time per batch (full batches), as its timing
    headers would report it; ``others_cores``: other processes' CPU during the run (0.15 and up: contended)."""
    c = config or Config("eager/cpu", 1, 1, 10)
    labels = {"model": "m", "batch_size": str(c.batch_size), "batch_delay": str(c.batch_delay_ms),
              "workers": str(c.workers)}  # fmt: skip
    latency = LatencySummary(
        count=sent - errors, mean_ms=p99 * 0.8, min_ms=p99 * 0.5, max_ms=p99 * 1.1, p50_ms=p50 or p99 * 0.8,
        p90_ms=p99 * 0.9, p95_ms=p99 * 0.95, p99_ms=p99, p999_ms=p99 * 1.05, at_or_above_p99=10,
    )  # fmt: skip
    return BenchResult(
        engine="async", url="http://127.0.0.1:1/predictions/m", mode="closed", concurrency=1, rate=None,
        arrival=None, started_at="2026-01-01T00:00:00+00:00", duration_s=sent / throughput, sent=sent,
        succeeded=sent - errors, errors={"503": errors} if errors else {}, throughput_rps=throughput,
        latency=latency, client=ClientUsage(0.1, 1.0, 10.0),
        server=None if handler_ms is None else ServerBreakdown(
            "headers", sent - errors, handler=Distribution(handler_ms), batch_size_mean=float(c.batch_size)
        ),
        labels=labels,
        host=None if others_cores is None else HostUsage(
            cores=2, wall_s=sent / throughput, busy_cores=1.0 + others_cores, client_cores=0.2, server_cores=0.8,
            others_cores=others_cores, steal_cores=None,
        ),
    )  # fmt: skip


def cost_model(a_ms: float = 100, b_ms: float = 20, slots: int = 2) -> Model:
    """The known-cost model in closed loop with batch x workers clients; a longer delay costs a little."""

    def measure(config: Config) -> tuple[float, ...]:
        throughput, latency = expected_closed_loop(a_ms, b_ms, slots, config.workers, config.batch_size)
        return throughput * (1 - config.batch_delay_ms / 1000), latency + 0.1 * config.batch_delay_ms

    return measure


def family(label: str = "eager/cpu", *, workers: tuple[int, ...] = (1, 2, 3, 4, 6, 8),
           batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32), delays: tuple[int, ...] = (10, 50),
           load: Load | None = None) -> Family:  # fmt: skip
    optimization, device = label.split("/")
    return Family(label, Path("/nonexistent/m.mar"), optimization, device, workers, batch, delays, load or Load())


def study(*families: Family, p99_ms: float | None = 300, strategy: str = "adaptive", remeasure: int = 2) -> Study:
    families = families or (family(),)
    return Study(
        model="m",
        families=families,
        baseline_family=families[0],
        sla=Sla(p99_ms=p99_ms),
        strategy=StrategySpec(strategy, remeasure),
    )


def drive(
    the_study: Study,
    model: Model,
    *,
    noise: Callable[[int], float] = lambda i: 1.0,
    handler: Callable[[Config], float] | None = None,
    disturbed: Callable[[int, Config], tuple[float, ...] | None] = lambda i, c: None,
) -> list[Trial]:
    """Run the study's strategy against ``model`` the way the loop does: the default config first, then proposals.
    ``handler``: the server's handler time per batch of a config, when its timing headers should be reported;
    ``disturbed``: what trial ``i`` of a config measured instead while another process took a core (None: the
    model's figures, measured in peace)."""
    strategy = load_strategy(the_study.strategy.name)(Space(the_study), the_study)
    trials: list[Trial] = []
    proposal: Proposal | None = Proposal(the_study.baseline, 0, "default")
    while proposal is not None:
        index = len(trials)
        busy = disturbed(index, proposal.config)
        measured = busy or model(proposal.config)
        if measured is None:
            trial = Trial(index, proposal.config, proposal.repeat, "error", error="HTTP 500: workers failed to start")
        else:
            throughput, p99, *p50 = measured
            own = None if handler is None else handler(proposal.config)
            measurement = result(throughput * noise(index), p99, p50=p50[0] if p50 else None, config=proposal.config,
                                 handler_ms=own, others_cores=1.0 if busy else 0.0)  # fmt: skip
            trial = Trial(index, proposal.config, proposal.repeat, "ok", measurement, reason=proposal.reason)
        trials.append(trial)
        strategy.observe(trial)
        proposal = strategy.propose()
        assert len(trials) < 10_000, "the strategy does not stop"
    return trials


def best_by_hand(the_study: Study, model: Model) -> Config:
    """The config with the highest throughput whose P99 meets the SLA, by enumeration."""
    limit = the_study.sla.p99_ms or math.inf
    scored = [(m[0], c) for c in Space(the_study).configs() if (m := model(c)) is not None and m[1] <= limit]
    return max(scored, key=lambda item: (item[0], [-x for x in (item[1].workers, item[1].batch_size)]))[1]
