"""Find the deployment that maximises throughput under a latency SLA, and hand back a config ready to serve.

    >>> study = override(load_study(Path("study.yaml")), sla_p99_ms=100)
    >>> result = tune(study, Path("study-tune"))
    >>> result.analysis.winner.config, result.deployment.serve_command

See docs/tune.md.
"""

from __future__ import annotations

from servetune.tune.analysis import Analysis, analyse
from servetune.tune.loader import load_study, override
from servetune.tune.loop import Remote, TuneResult, tune
from servetune.tune.strategies import STRATEGIES, Proposal, Strategy, load_strategy
from servetune.tune.study import AppConfig, Budget, Config, Family, Load, Objective, Point, Sla, StrategySpec, Study
from servetune.tune.trial import Summary, Trial, Verdict

__all__ = [
    "STRATEGIES",
    "Analysis",
    "AppConfig",
    "Budget",
    "Config",
    "Family",
    "Load",
    "Objective",
    "Point",
    "Proposal",
    "Remote",
    "Sla",
    "Strategy",
    "StrategySpec",
    "Study",
    "Summary",
    "Trial",
    "TuneResult",
    "Verdict",
    "analyse",
    "load_strategy",
    "load_study",
    "override",
    "tune",
]
