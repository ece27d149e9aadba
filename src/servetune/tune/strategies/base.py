"""The strategy interface and what every strategy shares: the trials seen so far and the final re-measure."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from servetune.tune.space import Space, cheap_order
from servetune.tune.study import Point, Study
from servetune.tune.trial import Summary, Trial, summarise_all

Plan = Generator["Proposal", None, None]
REMEASURE_BAND = 0.9
NEAR_MISS = 0.05  # a config that missed a latency limit by this little may meet it on another run


@dataclass(frozen=True)
class Proposal:
    """Measure ``config`` (its ``repeat``-th measurement, counting from 0) because of ``reason``."""

    config: Point
    repeat: int = 0
    reason: str = ""
    phase: str = ""  # "finalist": a round of the finalists' interleaved re-measure (``finalists.py``)


class Strategy:
    """Subclasses write :meth:`plan`, a generator of proposals that reads :attr:`trials` after each yield:
    the loop observes the proposal's trial before it asks for the next one."""

    name = "base"

    def __init__(self, space: Space, study: Study) -> None:
        self.space = space
        self.study = study
        self.trials: list[Trial] = []
        self._plan: Plan | None = None
        self._done = False

    # ---- the interface the loop calls ------------------------------------------------------------------

    def propose(self) -> Proposal | None:
        """The next config to measure, or None when the search is over."""
        if self._done:
            return None
        if self._plan is None:
            self._plan = self.plan()
        proposal = next(self._plan, None)
        self._done = proposal is None
        return proposal

    def observe(self, trial: Trial) -> None:
        self.trials.append(trial)

    def remaining(self) -> int:
        """An estimate of the trials still to come (for the progress bar's ETA)."""
        return 0

    # ---- for subclasses -----------------------------------------------------------------------------

    def plan(self) -> Plan:
        raise NotImplementedError

    def summaries(self) -> list[Summary]:
        """Configs of the space measured so far, best first."""
        return [s for s in summarise_all(self.trials, self.study) if s.config in self.space]

    def summary(self, config: Point) -> Summary | None:
        return next((s for s in self.summaries() if s.config == config), None)

    def measured(self, config: Point) -> bool:
        return any(t.config == config for t in self.trials)

    def remeasure(self) -> Plan:
        """Measure the best few configs that met the SLA once more, so that one lucky run does not win; and the
        few that missed a latency limit by a hair, or only in their tail while other processes disturbed the run,
        while serving more than the best, so that one unlucky run does not lose (each config's figures are then
        the mean of its runs measured in peace: ``trial.combine``)."""
        summaries = self.summaries()
        passed = [s for s in summaries if s.verdict.passed]
        if not passed:
            return
        # Only configs a second run could lift above the best: within REMEASURE_BAND of its objective.
        floor = REMEASURE_BAND * passed[0].verdict.objective
        top = {s.config: s for s in passed if s.verdict.objective >= floor}
        chosen = list(top)[: self.study.strategy.remeasure]
        near = [
            s
            for s in summaries
            if not s.verdict.passed
            and s.figures is not None
            and s.figures.error_rate <= self.study.sla.max_error_rate
            and (0 < s.verdict.violation <= NEAR_MISS or (not s.verdict.typical_miss and contended(s)))
            and s.throughput_rps > passed[0].throughput_rps
        ]
        top.update({s.config: s for s in near[: self.study.strategy.remeasure]})
        chosen += [s.config for s in near[: self.study.strategy.remeasure]]
        for config in cheap_order(chosen):
            runs = len(top[config].trials)
            if runs < 2:  # a config measured twice already (a strategy confirmed it) has had its second run
                yield Proposal(config, runs, "re-measure a top candidate" if top[config].verdict.passed
                               else "re-measure a near miss")  # fmt: skip


def contended(summary: Summary) -> bool:
    """Every run of the config was disturbed by other processes (its figures may be theirs, not its own)."""
    runs = [t for t in summary.trials if t.figures() is not None]
    return bool(runs) and all(t.contended for t in runs)
