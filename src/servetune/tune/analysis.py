"""What the trials say: the winner, the runners-up, the Pareto front, the default config, the closest miss."""

from __future__ import annotations

from dataclasses import dataclass, field

from servetune.tune import finalists as final
from servetune.tune import online
from servetune.tune.space import Space
from servetune.tune.study import Study
from servetune.tune.trial import Summary, Trial, summarise_all


@dataclass(frozen=True)
class Analysis:
    summaries: list[Summary]  # every config of the space measured, best first
    winner: Summary | None  # the best config that meets the SLA
    closest: Summary | None  # when nothing meets it: the config that missed it by least
    baseline: Summary | None  # the default config (1 worker, batch 1, eager)
    pareto: list[Summary]  # throughput vs P99, lowest P99 first
    references: list[tuple[str, Summary]] = field(default_factory=list)  # the study's references, measured
    finalists: final.Verdict | None = None  # the finalists' interleaved rounds and what they decided
    online: online.OnlineVerdict | None = None  # the winner against the online controller on the trace

    def top(self, n: int = 5) -> list[Summary]:
        passed = [s for s in self.summaries if s.verdict.passed]
        return (passed or self.summaries)[:n]

    @property
    def speedup(self) -> float | None:
        """Winner throughput over the default config's."""
        if self.winner is None or self.baseline is None or self.baseline.throughput_rps <= 0:
            return None
        return self.winner.throughput_rps / self.baseline.throughput_rps


def analyse(study: Study, trials: list[Trial]) -> Analysis:
    study = online.restore(study, trials)  # the controller's rounds name a family outside the space
    space = Space(study)
    every = summarise_all(trials, study)
    summaries = [s for s in every if s.config in space]
    passed = [s for s in summaries if s.verdict.passed]
    measured = [s for s in summaries if s.figures is not None]
    winner = passed[0] if passed else None
    verdict = final.compare(study, trials, final.all_finalists(study, trials, [s.config for s in summaries]))
    if verdict is not None and verdict.chosen is not None:
        chosen = next((s for s in passed if s.config == verdict.chosen), None)
        winner = chosen or winner
    closest = None if winner else min(measured, key=lambda s: s.verdict.violation, default=None)
    baseline = next((s for s in every if s.config == study.baseline), None)
    by_config = {s.config: s for s in every}
    references = [(label, by_config[config]) for label, config in study.references if config in by_config]
    front = pareto_front(measured + ([baseline] if baseline else []))
    # the controller's rounds decide the deployment only while the study asks for the comparison
    against = online.compare(study, trials) if study.strategy.controller else None
    return Analysis(summaries, winner, closest, baseline, front, references, verdict, against)


def pareto_front(summaries: list[Summary]) -> list[Summary]:
    """Configs no other beats on both throughput (higher) and P99 (lower)."""
    points = list({s.config: s for s in summaries if s.figures is not None}.values())
    front = []
    for s in points:
        p99, rps = s.latency("p99_ms") or 0.0, s.throughput_rps
        dominated = any(
            (o.latency("p99_ms") or 0.0) <= p99
            and o.throughput_rps >= rps
            and ((o.latency("p99_ms") or 0.0) < p99 or o.throughput_rps > rps)
            for o in points
        )
        if not dominated:
            front.append(s)
    return sorted(front, key=lambda s: (s.latency("p99_ms") or 0.0, -s.throughput_rps))
