"""Search strategies behind one registry: name -> ``"module:attr"`` of a :class:`~.base.Strategy` class.

A strategy is a tiny interface: :meth:`~.base.Strategy.propose` the next config to measure (or None when done),
:meth:`~.base.Strategy.observe` each trial. One loop (``servetune.tune.loop``) drives it and checkpoints.
"""

from __future__ import annotations

import importlib

from servetune._exceptions import ConfigError
from servetune.tune.strategies.base import Proposal, Strategy

STRATEGIES: dict[str, str] = {
    "adaptive": "servetune.tune.strategies.adaptive:AdaptiveSearch",
    "grid": "servetune.tune.strategies.grid:GridSearch",
}


def load_strategy(name: str) -> type[Strategy]:
    target = STRATEGIES.get(name)
    if target is None:
        raise ConfigError(f"strategy={name!r}: expected one of {', '.join(STRATEGIES)}")
    module_name, _, attr = target.partition(":")
    cls: type[Strategy] = getattr(importlib.import_module(module_name), attr)
    return cls


__all__ = ["STRATEGIES", "Proposal", "Strategy", "load_strategy"]
