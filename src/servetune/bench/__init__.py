"""Load generation and honest latency reports for any TorchServe-style HTTP endpoint.

The tuner calls :func:`run_bench` (or :func:`run_bench_async` from inside an event loop) with a :class:`BenchSpec`
and reads the :class:`BenchResult`. Engines are chosen by name through :data:`ENGINES`. An open loop runs on a
:class:`Schedule` (a rate, a synthetic :func:`shape` of :class:`Segment` s, or a trace from :func:`read_trace`);
with an :class:`Slo` the result carries goodput, attainment and windows (:class:`SloFigures`).
"""

from __future__ import annotations

from servetune.bench.engines import ENGINES, Engine, RunHooks, get_engine
from servetune.bench.host import HostUsage
from servetune.bench.result import BenchResult, ClientUsage, Distribution, Fidelity, LatencySummary, ServerBreakdown
from servetune.bench.runner import run_bench, run_bench_async, run_together
from servetune.bench.schedule import Schedule
from servetune.bench.shapes import Segment, shape
from servetune.bench.slo import Slo, SloFigures
from servetune.bench.spec import BenchSpec, StageSpec, parse_stages, parse_warmup
from servetune.bench.traces import read_trace

__all__ = [
    "ENGINES",
    "BenchResult",
    "BenchSpec",
    "ClientUsage",
    "Distribution",
    "Engine",
    "Fidelity",
    "HostUsage",
    "LatencySummary",
    "RunHooks",
    "Schedule",
    "Segment",
    "ServerBreakdown",
    "Slo",
    "SloFigures",
    "StageSpec",
    "get_engine",
    "parse_stages",
    "parse_warmup",
    "read_trace",
    "run_bench",
    "run_bench_async",
    "run_together",
    "shape",
]
