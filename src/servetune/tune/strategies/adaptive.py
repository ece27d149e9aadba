"""``adaptive``: ladders, then a hill climb, pruning what cannot win, then a re-measure of the top candidates.

1. From the default config (1 worker, batch 1) of the first family, raise the batch size while the score rises,
   then the workers at the best batch size while it rises ("more workers stop when throughput stops rising").
2. Measure every other family (optimization x device) at the best knobs so far.
3. Climb: measure the unmeasured neighbours of the best config (one step on each knob, the two anti-diagonals,
   the other families); move to the best; stop when no neighbour beats it by more than noise (``RISE``).
4. Re-measure the top candidates.

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

    def _ladder(self, start: Config, axis: str) -> Walk:
        """Step ``axis`` up from ``start`` while the score rises; return the best config of the walk."""
        current = start
        while (following := self.space.step(current, axis, 1)) is not None and not self.pruned(following):
            yield from self._measure(following, f"{axis.replace('_', ' ')} ladder")
            if not better(self._verdict(following), self._verdict(current)):
                break
            current = following
        return current

    def _climb(self) -> Plan:
        while True:
            best = self._best()
            wave = cheap_order(n for n in self.space.neighbours(best) if not self.measured(n) and not self.pruned(n))
            if not wave:
                return
            for config in wave:
                yield from self._measure(config, f"neighbour of {best.key}")
            if not better(self._verdict(self._best()), self._verdict(best)):
                return  # nothing beats it by more than noise: a local optimum

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
