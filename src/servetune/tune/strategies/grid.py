"""``grid``: every config of the space (the reference the adaptive search is judged against), then a re-measure."""

from __future__ import annotations

from servetune.tune.strategies.base import Plan, Proposal, Strategy


class GridSearch(Strategy):
    name = "grid"

    def plan(self) -> Plan:
        for config in self.space.configs():
            if not self.measured(config):
                yield Proposal(config, 0, "grid")
        yield from self.remeasure()

    def remaining(self) -> int:
        todo = sum(1 for c in self.space.configs() if not self.measured(c))
        return todo + (self.study.strategy.remeasure if todo else 0)
