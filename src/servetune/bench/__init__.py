"""Load generation and honest latency reports for any TorchServe-style HTTP endpoint.

The tuner calls :func:`run_bench` (or :func:`run_bench_async` from inside an event loop) with a :class:`BenchSpec`
and reads the :class:`BenchResult`. Engines are chosen by name through :data:`ENGINES`.
"""

from __future__ import annotations

from servetune.bench.engines import ENGINES, Engine, RunHooks, get_engine
from servetune.bench.result import BenchResult, ClientUsage, Distribution, LatencySummary, ServerBreakdown
from servetune.bench.runner import run_bench, run_bench_async, run_together
from servetune.bench.spec import BenchSpec, StageSpec, parse_stages, parse_warmup

__all__ = [
    "ENGINES",
    "BenchResult",
    "BenchSpec",
    "ClientUsage",
    "Distribution",
    "Engine",
    "LatencySummary",
    "RunHooks",
    "ServerBreakdown",
    "StageSpec",
    "get_engine",
    "parse_stages",
    "parse_warmup",
    "run_bench",
    "run_bench_async",
    "run_together",
]
