"""Search strategies behind one registry: name -> ``"module:attr"`` of a :class:`~.base.Strategy` class.

A strategy is a tiny interface: :meth:`~.base.Strategy.propose` the next config to measure (or None when done),
:meth:`~.base.Strategy.observe` each trial. One loop (``servetune.tune.loop``) drives it and checkpoints.
"""

from __future__ import annotations

from servetune.registry import registered
from servetune.tune.strategies.base import Proposal, Strategy

STRATEGIES: dict[str, str] = {
    "adaptive": "servetune.tune.strategies.adaptive:AdaptiveSearch",
    "grid": "servetune.tune.strategies.grid:GridSearch",
}


def load_strategy(name: str) -> type[Strategy]:
    cls: type[Strategy] = registered(STRATEGIES, name, f"strategy={name!r}: expected one of {', '.join(STRATEGIES)}")
    return cls


__all__ = ["STRATEGIES", "Proposal", "Strategy", "load_strategy"]
