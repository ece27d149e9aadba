"""``adaptive``: ladders, then a hill climb, pruning what cannot win, then a re-measure of the top candidates.

1. From the default config (1 worker, batch 1) of the first family, raise the batch size while the score rises,
   then the workers at the best batch size while it rises ("more workers stop when throughput stops rising");
   a ladder stops after two steps in a row that do not rise, or one that misses the SLA.
2. Measure every other family (optimization x device) at the best knobs so far.
3. Climb: measure the unmeasured neighbours of the best config (one step on each knob, the two anti-diagonals,
   the other families); move to the best; stop when no neighbour beats it by more than noise (``RISE``). Before a
   move, the best and the challenger are measured a second time, and the move is taken only if it still wins on
   the averages: a move costs a wave of trials, one lucky run should not buy it. After a move, a step that
   clearly lost from the previous centre is not tried from the new one.
4. Re-measure the top candidates (those not already measured twice).

Pruned without measuring: a larger batch at the same family, workers and delay as a config whose median request
already missed a latency limit (a tail miss may be noise, so it is measured; when the load makes the rule a sure
thing, see ``Load.batch_monotone``), and configs of a family whose workers could not be started.

The score of a config is its objective when it meets the SLA and minus its relative miss otherwise, so the same
walk finds the closest config when none meets the SLA.
"""

from __future__ import annotations

import math
from collections.abc import Generator

from servetune.tune.space import cheap_order
from servetune.tune.strategies.base import Plan, Proposal, Strategy
from servetune.tune.study import Config
from servetune.tune.trial import Verdict

RISE = 0.02  # a score must beat the previous one by this fraction to count as rising (noise)
Walk = Generator[Proposal, None, Config]


def better(a: Verdict, b: Verdict) -> bool:
    """``a`` beats ``b`` by more than noise."""
    if math.isinf(b.score):
        return not math.isinf(a.score)
    return a.score > b.score + RISE * abs(b.score)


class AdaptiveSearch(Strategy):
    name = "adaptive"

    def plan(self) -> Plan:
        families = self.space.families
        first = families[0]
        seed = self.space.project(self.study.baseline, first)
        yield from self._measure(seed, "start: the default config")
        best = yield from self._ladder(seed, "batch_size")
        yield from self._ladder(best, "workers")
        for family in families[1:]:
            config = self.space.project(self._best(), family)
            yield from self._measure(config, f"{family.label} at the best knobs so far")
        yield from self._climb()
        yield from self.remeasure()

    def remaining(self) -> int:
        families = self.space.families
        f = families[0]
        planned = len(f.batch_sizes) + len(f.workers) + len(families) + 8 + self.study.strategy.remeasure
        measured = len({t.config for t in self.trials})
        return max(0, min(len(self.space), planned) - measured)

    # ---- walks ----------------------------------------------------------------------------------------

    def _measure(self, config: Config, reason: str) -> Plan:
        if not self.measured(config) and not self.pruned(config):
            yield Proposal(config, 0, reason)

    def _confirm(self, config: Config, reason: str) -> Plan:
        runs = sum(1 for t in self.trials if t.config == config)
        if runs < 2:
            yield Proposal(config, runs, reason)

    def _ladder(self, start: Config, axis: str) -> Walk:
        """Step ``axis`` up from ``start`` while the score rises; return the best config of the walk. One step that
        does not rise is not enough to stop (a noisy run, or a knob that pays off only in pairs: two workers on two
        cores under two clients): the step after it is measured too, and the ladder goes on from there if it rose."""
        current = start
        label = f"{axis.replace('_', ' ')} ladder"
        while (following := self.space.step(current, axis, 1)) is not None and not self.pruned(following):
            yield from self._measure(following, label)
            if not better(self._verdict(following), self._verdict(current)):
                beyond = self.space.step(following, axis, 1)
                if (
                    beyond is None
                    or self.pruned(beyond)
                    or self._verdict(following).score < 0 <= self._verdict(current).score
                ):
                    break  # off the edge, pruned, or the step already missed the SLA: no second chance
                yield from self._measure(beyond, f"{label}, one step past a flat one")
                if not better(self._verdict(beyond), self._verdict(current)):
                    break
                following = beyond
            current = following
        return current

    def _climb(self) -> Plan:
        previous: Config | None = None
        while True:
            best = self._best()
            wave = cheap_order(
                n
                for n in self.space.neighbours(best)
                if not self.measured(n) and not self.pruned(n) and not self._lost_before(n, best, previous)
            )
            if not wave:
                return
            for config in wave:
                yield from self._measure(config, f"neighbour of {best.key}")
            challenger = self._best()
            if not better(self._verdict(challenger), self._verdict(best)):
                return  # nothing beats it by more than noise: a local optimum
            # A move costs a wave of trials: take it on two runs of each side, not on one lucky run.
            for config in cheap_order([best, challenger]):
                yield from self._confirm(config, f"confirm before moving from {best.key} to {challenger.key}")
            if self._best() != challenger or not better(self._verdict(challenger), self._verdict(best)):
                return
            previous = best

    def _lost_before(self, config: Config, best: Config, previous: Config | None) -> bool:
        """After a move from ``previous`` to ``best``, the same step from ``previous`` was measured and clearly lost
        to it: the knobs act alike at both points (they differ in one knob), so the step is not tried again."""
        if previous is None or not config.family == best.family == previous.family:
            return False
        counterpart: Config | None = previous
        for axis in ("workers", "batch_size", "batch_delay_ms"):
            delta = self.space.index(config, axis) - self.space.index(best, axis)
            if delta and counterpart is not None:
                counterpart = self.space.step(counterpart, axis, delta)
        if counterpart is None or counterpart in (previous, best) or not self.measured(counterpart):
            return False
        return better(self._verdict(previous), self._verdict(counterpart))

    # ---- what is known ---------------------------------------------------------------------------------

    def _verdict(self, config: Config) -> Verdict:
        summary = self.summary(config)
        assert summary is not None, config
        return summary.verdict

    def _best(self) -> Config:
        return self.summaries()[0].config

    def pruned(self, config: Config) -> bool:
        family = self.space.family(config)
        for summary in self.summaries():
            other = summary.config
            if other.family != config.family:
                continue
            if summary.figures is None and summary.error and other.workers <= config.workers:
                return True  # its workers could not start with fewer: they will not start now
            if (
                summary.figures is not None
                and summary.verdict.typical_miss
                and (other.workers, other.batch_delay_ms) == (config.workers, config.batch_delay_ms)
                and other.batch_size < config.batch_size
                and family.load.batch_monotone(other.workers, other.batch_size)
            ):
                return True
        return False
