"""servetune's online controller against the published controllers, on the same seeded traces, one server, one model.

    python benchmarks/controller_vs_baselines.py --quick [--json rows.json]
    python benchmarks/controller_vs_baselines.py [--seconds 900] [--policies controller,greedy,...] [--json rows.json]
    python benchmarks/controller_vs_baselines.py --model resnet18 --quick --sla-x 5 [--decisions DIR]

``--decisions DIR`` keeps each run's decision log (``m<run>-<policy>.jsonl``: every batch, knob change and shed request)
and its requests (``m<run>-<policy>.npz``: ``start_s``, ``latency_ms``, ``status``, one entry per request sent).
``--capacity RPS`` takes C from an earlier run instead of measuring it; ``--scores moving`` measures the moving load
alone (``scale``, ``overload``: the others; overload needs the sustainable scale).
``--cpu-pairs N`` then replays the moving trace N times each for the controller and static, in ABBA order, and
prints their CPU per 1,000 good answers pair by pair (the median ratio and each pair's; one run each decides nothing:
two policies serving the same batches measured 0.97 and 0.78 in one run).

``--model cost`` (default) is a known-cost model: each batch of n sleeps a + b·n ms (25 + 2.5n by default), so batching
matters and the right answers can be computed. ``--model resnet18`` is ResNet-18 on the CPU (random weights, seed 0)
behind the built-in image_classifier (examples/resnet18), one intra-op thread per worker, a 320×240 PNG per request;
its cost a + b·n is fitted first from the server's own handler times at batch 1 and batch 8 (closed loops on the
static winner's workers), and printed; every registration of it gets 8 requests per worker before its measured run
(a fresh worker's first passes are slow, and would count against whichever policy runs first on them).
SLA P99 100 ms (``--sla-ms``), or a stated multiple of the model's batch-1 time (``--sla-x``: resnet18's batch of
one takes 40-47 ms on this machine's cores, so 100 ms leaves no room for batching or queueing); the static winner
(and greedy, aimd, lsq) on two workers, the policies that move workers (controller, queue, oracle) within [1, 4]
(resnet18: [1, the machine's cores], since a worker per core is what a CPU model can use). Each policy is the same
archive with its own ``controller:`` section (docs/controller.md), registered through the management API for its run
and unregistered after: one server, the same model, the same trace (a seeded open loop, ``servetune.bench``).

1. **Capacity** C: the static winner's (the largest batch inside the SLA, no delay) highest steady Poisson rate with
   P99 inside the SLA, by bisection (6 s runs); in a full run that rate must then hold for ``--hold-s`` (60 s) with
   attainment >= 99%, else it steps down by 5% until it does.
2. **Moving load** (``--seconds``, 900; quick 60): a daily curve 0.2 C → 0.9 C → 0.2 C, a 2.5× step 0.3 C → 0.75 C,
   a burst to 0.9 C (20 s; quick 3 s) over 0.4 C, Gamma arrivals of CV 2 at 0.6 C. Attainment (good answers over all
   sent: 503s and errors are misses), share of 10 s windows inside the SLA (99% of the window's requests good, a
   503 counted as one miss, as in attainment), recovery after the step (the end of the
   last 1 s window after the step under 99% good, from the step), CPU-seconds (server and workers) per 1,000 good.
3. **Sustainable scale**: the largest multiplier of a short version of that trace (90 s; quick 10 s) at which the
   policy still answers >= 99% good, by bisection between 0.25 and 2 on a log scale (5 steps; quick 3): the first
   step tries 0.71, the quick run's last steps tell the scale within a factor of 1.3.
4. **Overload**: 1.5× the policy's own sustainable peak rate (60 s; quick 15 s), then 0.5 C (30 s; quick 10 s):
   goodput during the overload over that sustainable rate, and the recovery after it.

Static and oracle knobs: they are computed offline from the cost (known, or fitted for resnet18) and the rate (the
static winner at the trace's peak, ``static``; at its mean, ``static-mean``; the oracle: the same for each phase at
that phase's peak rate, knowing the trace in hindsight, on the most workers any phase needs), not searched with the
tuner: docs/controller.md says so
next to the figures. ``--quick``: controller, greedy, static and oracle only. The policies run one after another,
in the list's order turned by one place from one seed to the next (seed 1: the list's order; seed 2 starts with
the second policy): the machine's drift over a run's minutes falls on each policy in turn.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import signal
import sys
import tempfile
import textwrap
import time
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from servetune.archive import create_archive
from servetune.bench import BenchSpec, run_bench
from servetune.bench.host import process_cpu_s
from servetune.bench.schedule import Schedule
from servetune.bench.shapes import Burst, Segment, shape
from servetune.bench.slo import Slo
from servetune.control import Cost, decide
from servetune.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[1]

HANDLER = textwrap.dedent(
    """
    import time

    def handle(data, context):
        if data is None:
            return None
        cost = context.model_yaml_config["cost"]
        time.sleep((cost["a_ms"] + cost["b_ms"] * len(data)) / 1000.0)
        return ["ok"] * len(data)
    """
)
ALL_POLICIES = ("controller", "greedy", "static", "static-mean", "aimd", "lsq", "queue", "oracle")
QUICK_POLICIES = ("controller", "greedy", "static", "oracle")
BATCH_BOUNDS = (1, 32)
DELAY_BOUNDS = (0, 50)
SCORES = frozenset(("moving", "scale", "overload"))  # the three scores (``--scores``)
SCALE_RANGE = (0.25, 2.0)  # the sustainable scale's bisection (log scale); the low end is printed as "<=", unmeasured


@dataclass(frozen=True)
class Served:
    """What every policy serves: its archive's files (``create_archive``'s keywords besides the name and the config)
    and model-config.yaml (the policy's ``controller:`` section is added), the request body, a label for the rows."""

    files: dict[str, Any]
    config: dict[str, Any]
    body: Path
    label: str
    warmup: int = 0  # requests per worker sent before each measured run (a CNN's first passes are slow)


def known_cost(tmp: Path, cost: Cost) -> Served:
    (tmp / "handler.py").write_text(HANDLER)
    (tmp / "body.bin").write_bytes(b"x" * 64)
    config = {"batchSize": 8, "maxBatchDelay": 0, "cost": {"a_ms": cost.a_ms, "b_ms": cost.b_ms}}
    label = f"known-cost {cost.a_ms:g}+{cost.b_ms:g}n ms"
    return Served({"handler": str(tmp / "handler.py")}, config, tmp / "body.bin", label)


def resnet18(tmp: Path) -> Served:
    """ResNet-18 (random weights, seed 0) behind the built-in image_classifier, one thread per worker."""
    import torch

    sys.path.insert(0, str(ROOT / "examples" / "resnet18"))
    from make_archive import sample_image
    from model import ResNet18

    torch.manual_seed(0)
    weights, labels = tmp / "resnet18.pt", tmp / "index_to_name.json"
    torch.save(ResNet18().eval().state_dict(), weights)
    labels.write_text(json.dumps({str(i): f"class_{i}" for i in range(1000)}))
    files = {
        "handler": "image_classifier",
        "serialized_file": str(weights),
        "model_file": str(ROOT / "examples" / "resnet18" / "model.py"),
        "extra_files": [str(labels)],
    }
    config = {"batchSize": 8, "maxBatchDelay": 0, "numThreads": 1}
    return Served(files, config, sample_image(tmp / "sample.png"), "resnet18 (CPU, 1 thread per worker)", warmup=8)


@dataclass(frozen=True)
class Setup:
    cost: Cost  # known, or fitted (resnet18)
    sla_ms: float
    workers: int  # the static winner's (and greedy's, aimd's, lsq's)
    max_workers: int  # the bound of the policies that move workers (controller, queue, oracle)
    seconds: float  # the moving trace
    short_s: float  # the bisection's trace
    bisect_steps: int
    hold_s: float  # C must hold this long at a steady rate (0: the bisection's 6 s steps alone)
    overload_s: float
    after_s: float
    burst_s: float
    quick: bool


@dataclass(frozen=True)
class Phase:
    seconds: float
    peak_fraction: float  # of C: the phase's highest rate, for the oracle's knobs
    segment: Segment


def phases(setup: Setup, c: float, scale: float = 1.0, seconds: float | None = None) -> list[Phase]:
    """The moving trace's phases, ``seconds`` long in all, rates ``scale`` times those of the issue."""
    total = seconds or setup.seconds
    k = c * scale
    burst_s = min(setup.burst_s, 0.1 * total)
    parts = [
        (0.40, 0.9, Segment(0.40 * total, diurnal=(0.2 * k, 0.9 * k))),
        (0.10, 0.3, Segment(0.10 * total, 0.3 * k)),
        (0.10, 0.75, Segment(0.10 * total, 0.75 * k)),
        (0.15, 0.9, Segment(0.15 * total, 0.4 * k, burst=Burst(0.05 * total, burst_s, 0.5 * k))),
        (0.25, 0.6, Segment(0.25 * total, 0.6 * k, process="gamma", cv=2.0)),
    ]
    return [Phase(share * total, peak * scale, segment) for share, peak, segment in parts]


def schedule_of(parts: list[Phase], seed: int) -> Schedule:
    return shape([p.segment for p in parts], process="poisson", seed=seed)


# ---- the policies' archives ----------------------------------------------------------------------------------


def knobs_for(setup: Setup, rate: float, workers: tuple[int, int] | None = None) -> dict[str, Any]:
    """The best static config for a steady ``rate``, from the known cost (the law's offline answer, no margin):
    with ``workers`` bounds, the fewest workers that carry it; else the static winner's workers."""
    w = workers or (setup.workers, setup.workers)
    law = decide(setup.cost, rate, setup.sla_ms, 0.0, BATCH_BOUNDS, DELAY_BOUNDS, w)
    k = law.knobs
    return {"batch_size": k.batch_size, "max_batch_delay_ms": k.max_batch_delay_ms, "workers": k.workers}


def controller_section(setup: Setup, policy: str, c: float, parts: list[Phase], mean_rate: float) -> dict[str, Any]:
    section: dict[str, Any] = {
        "slo": {"p99_ms": setup.sla_ms},
        "bounds": {
            "batch_size": list(BATCH_BOUNDS),
            "max_batch_delay_ms": list(DELAY_BOUNDS),
            "workers": [setup.workers, setup.workers],
        },
    }
    elastic = [1, setup.max_workers]  # the policies that move workers may use up to max_workers
    if policy == "controller":
        section["shed"] = True
        section["bounds"]["workers"] = elastic
    elif policy in ("static", "static-mean"):
        rate = c * max(p.peak_fraction for p in parts) if policy == "static" else mean_rate
        section["policy"] = "static"
        section["static"] = knobs_for(setup, rate)
    elif policy == "oracle":
        # per phase the best static batching at the phase's peak; workers held at the most any phase needs (a worker
        # takes a second or more to start: switching them at a phase's start would cost the oracle its first second)
        section["policy"] = "oracle"
        until = 0.0
        section["phases"] = []
        each = [knobs_for(setup, p.peak_fraction * c, (1, setup.max_workers)) for p in parts]
        most = max(k["workers"] for k in each)
        for p in parts:
            until += p.seconds
            held = knobs_for(setup, p.peak_fraction * c, (most, most))
            section["phases"].append({"until_s": round(until, 3), **held})
        section["phases"][-1]["until_s"] = 1e9
        section["bounds"]["workers"] = [most, most]
    elif policy == "queue":
        section["policy"] = "queue"
        section["bounds"]["workers"] = elastic
    else:
        section["policy"] = policy
    return section


def build_archive(store: Path, served: Served, name: str, section: dict[str, Any]) -> str:
    src = Path(tempfile.mkdtemp(prefix=f"src-{name}-", dir=store))
    config = dict(served.config)
    if section:
        config["controller"] = section
    (src / "model-config.yaml").write_text(yaml.safe_dump(config))
    path = create_archive(
        model_name=name,
        version="1.0",
        config_file=str(src / "model-config.yaml"),
        export_path=str(store),
        force=True,
        **served.files,
    )
    return Path(path).name


# ---- the server ---------------------------------------------------------------------------------------------


def call(url: str, method: str) -> tuple[int, Any]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=300)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""))
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, json.loads(body) if body else None
    finally:
        conn.close()


class Bench:
    def __init__(self, server: EmbeddedServer, store: Path, setup: Setup, served: Served) -> None:
        self.server, self.store, self.setup, self.served = server, store, setup, served
        self.body = served.body
        self.runs = 0
        self.decisions: Path | None = None  # --decisions: each run's decision log, named after its model

    def label(self, section: dict[str, Any]) -> str:
        return str(section.get("policy", "controller"))

    def register(self, section: dict[str, Any], workers: int) -> str:
        self.runs += 1
        name = f"m{self.runs}"
        if self.decisions is not None:
            section = {**section, "log": str(self.decisions / f"{name}-{self.label(section)}.jsonl")}
        archive = build_archive(self.store, self.served, name, section)
        query = urllib.parse.urlencode({"url": archive, "initial_workers": workers, "synchronous": "true"})
        status, body = call(f"{self.server.management_url}/models?{query}", "POST")
        if status != 200:
            raise RuntimeError(f"registering {name}: {status} {body}")
        if self.served.warmup:  # every worker past its first, slow passes before anything is measured
            url = f"{self.server.inference_url}/predictions/{name}"
            run_bench(BenchSpec(url=url, input=self.body, concurrency=workers, requests=self.served.warmup * workers))
        return name

    def cpu_s(self) -> tuple[float, float]:
        """The server's CPU-seconds so far: every live process's own, plus what each has reaped of its exited
        children (a worker stopped during a run took its CPU with it: counted only through its parent's reaped
        times); and the live processes' own only (the measure before 2026-12-05, which lost a stopped worker's CPU,
        and the CPU its process had spent before the run too: it understated the policies that move workers)."""
        assert self.server.proc is not None
        root = psutil.Process(self.server.proc.pid)
        total = live = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:
                times = p.cpu_times()
            except psutil.NoSuchProcess:  # gone since listed: its parent's reaped times hold it (the next call)
                continue
            live += times.user + times.system
            total += process_cpu_s(times)
        return total, live

    def run(self, section: dict[str, Any], schedule: Schedule, workers: int) -> dict[str, Any]:
        """Register, replay ``schedule`` (open loop, judged against the SLA), describe, unregister."""
        name = self.register(section, workers)
        try:
            cpu0 = self.cpu_s()
            spec = BenchSpec(
                url=f"{self.server.inference_url}/predictions/{name}",
                input=self.body,
                schedule=schedule,
                # a 503 or an error is a miss, once, as attainment counts it: a 10 s window is inside when 99% of
                # its requests were answered in time. (The bench's default error budget, 0.1%, failed a window for
                # one shed request, while late answers failed it only past 1%.)
                slo=Slo(p99_ms=self.setup.sla_ms, max_error_rate=0.01),
                window_s=10.0,
                timeout=30.0,
            )
            result = run_bench(spec)
            cpu1 = self.cpu_s()
            cpu, cpu_live = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
            status, described = call(f"{self.server.management_url}/models/{name}", "GET")
            controller = described[0].get("controller", {}) if status == 200 else {}
        finally:
            call(f"{self.server.management_url}/models/{name}", "DELETE")
        rec = result.samples
        assert rec is not None and result.slo is not None
        start = np.frombuffer(rec.start_s, dtype=np.float64)
        latency = np.frombuffer(rec.latency_ms, dtype=np.float64)
        status_codes = np.frombuffer(rec.status, dtype=np.int32)
        good = (status_codes >= 200) & (status_codes < 300) & (latency <= self.setup.sla_ms)
        if self.decisions is not None:  # each request's send time (s), latency (ms) and status, beside the log
            out = self.decisions / f"{name}-{self.label(section)}.npz"
            np.savez_compressed(out, start_s=start, latency_ms=latency, status=status_codes)
        return {
            "start": start,
            "good": good,
            "attainment": result.slo.attainment,
            "windows_in_sla": result.slo.windows_share,
            "cpu_s_per_1000": 1000.0 * cpu / max(1, int(good.sum())),
            "cpu_s_per_1000_live": 1000.0 * cpu_live / max(1, int(good.sum())),  # the old measure (``cpu_s``)
            "knob_changes": int(controller.get("knobChanges", 0)),
            "batches": int(sum(controller.get("batches", {}).values())),
            "shed": int(controller.get("shed", 0)),
            "p99_ms": result.latency.p99_ms if result.latency else math.nan,
        }

    def batch_ms(self, batch: int, workers: int, seconds: float = 8.0) -> float:
        """The median handler time of a batch of ``batch`` on ``workers`` busy workers (a closed loop that keeps
        every worker's batches full), from the server's own per-request timing."""
        knobs = {"batch_size": batch, "max_batch_delay_ms": 50 if batch > 1 else 0, "workers": workers}
        name = self.register({"slo": {"p99_ms": self.setup.sla_ms}, "policy": "static", "static": knobs}, workers)
        try:
            spec = BenchSpec(
                url=f"{self.server.inference_url}/predictions/{name}",
                input=self.body,
                concurrency=2 * batch * workers,
                duration=seconds,
                warmup_seconds=2.0,
                timeout=60.0,
            )
            result = run_bench(spec)
        finally:
            call(f"{self.server.management_url}/models/{name}", "DELETE")
        rec = result.samples
        assert rec is not None
        handler = np.frombuffer(rec.handler_ms, dtype=np.float64)
        sizes = np.frombuffer(rec.batch_size, dtype=np.int32)
        full = handler[(sizes == batch) & np.isfinite(handler)]
        if not len(full):
            raise RuntimeError(f"no batch of {batch} was served (sizes seen: {sorted(set(sizes.tolist()))})")
        return float(np.median(full))


def fit_cost(bench: Bench, workers: int, log: Any) -> Cost:
    """a + b·n through the median batch times at n = 1 and n = 8, measured on the static winner's workers."""
    t1, t8 = bench.batch_ms(1, workers), bench.batch_ms(8, workers)
    b = max(0.0, (t8 - t1) / 7.0)
    cost = Cost(max(0.0, t1 - b), b)
    log(f"cost: batch 1 {t1:.1f} ms, batch 8 {t8:.1f} ms on {workers} busy workers -> {cost.a_ms:.1f} + "
        f"{cost.b_ms:.2f}·n ms")  # fmt: skip
    return cost


def recovery_s(run: dict[str, Any], at: float, until: float, window: float = 1.0) -> float:
    """From ``at``, the end of the last ``window`` before ``until`` whose requests were under 99% good (0: none)."""
    start, good = run["start"], run["good"]
    last_bad = at
    t = at
    while t < until - 1e-9:
        inside = (start >= t) & (start < t + window)
        if inside.sum() and good[inside].mean() < 0.99:
            last_bad = t + window
        t += window
    return last_bad - at


# ---- the three scores ---------------------------------------------------------------------------------------


def capacity(bench: Bench, setup: Setup, log: Any) -> float:
    """The static winner's highest steady rate with P99 inside the SLA (bisection over 6 s Poisson runs, then held)."""
    cost, w = setup.cost, setup.workers
    top = decide(cost, 1e9, setup.sla_ms, 0.0, BATCH_BOUNDS, DELAY_BOUNDS, (w, w)).knobs.batch_size
    ideal = w * top / cost.t(top) * 1000.0
    winner = {"batch_size": top, "max_batch_delay_ms": 0, "workers": w}
    section = {"slo": {"p99_ms": setup.sla_ms}, "policy": "static", "static": winner}
    low, high = 0.3 * ideal, 1.05 * ideal
    for step in range(4 if setup.quick else 6):
        rate = (low + high) / 2
        run = bench.run(section, Schedule.steady(rate, "poisson", seconds=6.0, seed=100 + step), w)
        inside = run["p99_ms"] <= setup.sla_ms and run["attainment"] >= 0.99
        log(f"  capacity: {rate:.0f} req/s -> P99 {run['p99_ms']:.1f} ms, {'inside' if inside else 'outside'}")
        low, high = (rate, high) if inside else (low, rate)
    # a 6 s step can overstate what holds for minutes (resnet18: 31 req/s inside in 6 s, past it over 15 minutes):
    # the rate found must then hold for hold_s, else it steps down by 5% until it does (at most 5 times)
    for step in range(5 if setup.hold_s > 0 else 0):
        run = bench.run(section, Schedule.steady(low, "poisson", seconds=setup.hold_s, seed=200 + step), w)
        held = run["p99_ms"] <= setup.sla_ms and run["attainment"] >= 0.99
        log(f"  capacity held {setup.hold_s:g} s: {low:.1f} req/s -> P99 {run['p99_ms']:.1f} ms, "
            f"attainment {100 * run['attainment']:.2f}%, {'held' if held else 'not held'}")  # fmt: skip
        if held:
            break
        low *= 0.95
    log(f"capacity C = {low:.0f} req/s (static winner: batch {top}, no delay, {w} workers; ideal {ideal:.0f})")
    return low


def score(
    bench: Bench, setup: Setup, policy: str, c: float, seed: int, log: Any, scores: frozenset[str] = SCORES
) -> dict[str, Any]:
    """The policy's three scores (those in ``scores``; the others NaN)."""
    w = setup.workers
    parts = phases(setup, c)
    moving = schedule_of(parts, seed)
    mean_rate = len(moving) / moving.duration_s
    section = controller_section(setup, policy, c, parts, mean_rate)
    run = bench.run(section, moving, w)
    step_at = sum(p.seconds for p in parts[:2])
    recovery = recovery_s(run, step_at, step_at + parts[2].seconds)
    log(
        f"  {policy}: moving load: attainment {100 * run['attainment']:.2f}%, "
        f"windows {100 * run['windows_in_sla']:.0f}%, recovery {recovery:.1f} s, "
        f"{run['cpu_s_per_1000']:.2f} CPU-s/1000 good, {run['knob_changes']} changes"
    )
    # sustainable scale: bisection on the short trace, each policy configured for that scale (the oracle knows it)
    low, high = SCALE_RANGE
    for step in range(setup.bisect_steps if "scale" in scores else 0):
        k = math.sqrt(low * high)
        short = phases(setup, c, k, setup.short_s)
        sec = controller_section(setup, policy, c, short, len(schedule_of(short, seed)) / setup.short_s)
        if policy == "static":  # the static winner is the one measured at scale 1
            sec = section
        trial = bench.run(sec, schedule_of(short, seed + 1 + step), w)
        ok = trial["attainment"] >= 0.99
        log(f"    scale {k:.2f}: attainment {100 * trial['attainment']:.2f}% {'ok' if ok else 'no'}")
        low, high = (k, high) if ok else (low, k)
    sustainable = low if "scale" in scores else math.nan
    goodput = back = math.nan
    if "overload" in scores:
        goodput, back = overload(bench, setup, policy, c, sustainable, section, seed, log)
    return {
        "model": bench.served.label,
        "policy": policy,
        "attainment": round(run["attainment"], 5),
        "windows_in_sla": round(run["windows_in_sla"], 3),
        "recovery_s": round(recovery, 2),
        "sustainable_scale": round(sustainable, 3),
        "overload_goodput": round(float(goodput), 3),
        "overload_recovery_s": round(back, 2),
        "cpu_s_per_1000": round(run["cpu_s_per_1000"], 3),
        "cpu_s_per_1000_live": round(run["cpu_s_per_1000_live"], 3),
        "knob_changes": run["knob_changes"],
        "shed": run["shed"],
        "p99_ms": round(run["p99_ms"], 2),
        "capacity_rps": round(c, 1),
    }


def overload(
    bench: Bench, setup: Setup, policy: str, c: float, sustainable: float, section: dict[str, Any], seed: int, log: Any
) -> tuple[float, float]:
    """Goodput during 1.5x the policy's own sustainable peak rate (a share of that rate), and the recovery after."""
    w = setup.workers
    # overload: 1.5x the policy's own sustainable peak rate, then 0.5 C
    rate = 0.9 * c * sustainable
    over = Schedule.steady(1.5 * rate, "poisson", seconds=setup.overload_s, seed=seed + 50).then(
        Schedule.steady(0.5 * c, "poisson", seconds=setup.after_s, seed=seed + 51)
    )
    overload_parts = [Phase(setup.overload_s, 1.5 * 0.9 * sustainable, Segment(setup.overload_s, 1.5 * rate))]
    overload_parts.append(Phase(1e9, 0.5, Segment(setup.after_s, 0.5 * c)))
    sec = section if policy in ("static", "static-mean") else controller_section(setup, policy, c, overload_parts, rate)
    trial = bench.run(sec, over, w)
    during = trial["start"] < setup.overload_s
    goodput = trial["good"][during].sum() / setup.overload_s / rate
    back = recovery_s(trial, setup.overload_s, setup.overload_s + setup.after_s)
    log(f"    overload: goodput {goodput:.2f} of {rate:.0f} req/s, recovery {back:.1f} s")
    return float(goodput), back


def cpu_pairs(bench: Bench, setup: Setup, c: float, seed: int, pairs: int, log: Any) -> dict[str, Any]:
    """CPU per 1,000 good answers, controller against static, on the same moving trace, ``pairs`` times each in ABBA
    order (controller, static, static, controller, ...): a drift of the machine over the minutes falls on both alike.
    Each pair's ratio, their median and range, and each run's batches (the knobs' share of the CPU)."""
    parts = phases(setup, c)
    moving = schedule_of(parts, seed)
    mean_rate = len(moving) / moving.duration_s
    sections = {p: controller_section(setup, p, c, parts, mean_rate) for p in ("controller", "static")}
    runs: dict[str, list[dict[str, Any]]] = {"controller": [], "static": []}
    for i in range(pairs):
        for policy in ("controller", "static") if i % 2 == 0 else ("static", "controller"):
            run = bench.run(sections[policy], moving, setup.workers)
            runs[policy].append(run)
            log(
                f"  cpu pair {i + 1}, {policy}: {run['cpu_s_per_1000']:.3f} CPU-s/1000 good (live processes only: "
                f"{run['cpu_s_per_1000_live']:.3f}), {run['batches']} batches"
            )
    ratios = [
        mine["cpu_s_per_1000"] / theirs["cpu_s_per_1000"]
        for mine, theirs in zip(runs["controller"], runs["static"], strict=True)
    ]
    return {
        "ratios": [round(r, 3) for r in ratios],
        "median_ratio": round(float(np.median(ratios)), 3),
        "controller_cpu_s_per_1000": [round(r["cpu_s_per_1000"], 3) for r in runs["controller"]],
        "static_cpu_s_per_1000": [round(r["cpu_s_per_1000"], 3) for r in runs["static"]],
        "controller_cpu_s_per_1000_live": [round(r["cpu_s_per_1000_live"], 3) for r in runs["controller"]],
        "static_cpu_s_per_1000_live": [round(r["cpu_s_per_1000_live"], 3) for r in runs["static"]],
        "controller_batches": [r["batches"] for r in runs["controller"]],
        "static_batches": [r["batches"] for r in runs["static"]],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "policy",
        "attain %",
        "win %",
        "recov s",
        "scale",
        "ovl gp",
        "ovl rec s",
        "CPU-s/1k",
        "changes",
        "shed",
        "P99 ms",
    )
    lines = [" ".join(f"{h:>10}" for h in head)]
    for r in rows:
        values = (
            r["policy"],
            f"{100 * r['attainment']:.2f}",
            f"{100 * r['windows_in_sla']:.0f}",
            f"{r['recovery_s']:.1f}",
            ("<=" if r["sustainable_scale"] <= SCALE_RANGE[0] else "") + f"{r['sustainable_scale']:.2f}",
            f"{r['overload_goodput']:.2f}",
            f"{r['overload_recovery_s']:.1f}",
            f"{r['cpu_s_per_1000']:.2f}",
            str(r["knob_changes"]),
            str(r["shed"]),
            f"{r['p99_ms']:.1f}",
        )
        lines.append(" ".join(f"{v:>10}" for v in values))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 s traces; controller, greedy, static, oracle")
    parser.add_argument("--model", choices=("cost", "resnet18"), default="cost", help="the model every policy serves")
    parser.add_argument("--seconds", type=float, default=900.0, help="the moving trace's length (full run)")
    parser.add_argument(
        "--policies", default=None, help=f"comma-separated, of {', '.join(ALL_POLICIES)}; none: --cpu-pairs alone"
    )
    parser.add_argument("--a-ms", type=float, default=25.0, help="the model's fixed cost per batch")
    parser.add_argument("--b-ms", type=float, default=2.5, help="the model's cost per request")
    parser.add_argument("--sla-ms", type=float, default=100.0, help="P99 SLA")
    parser.add_argument(
        "--sla-x", type=float, default=None, help="P99 SLA as this multiple of the batch-1 time (instead of --sla-ms)"
    )
    parser.add_argument("--workers", type=int, default=2, help="the static winner's workers (C is measured with them)")
    parser.add_argument(
        "--max-workers", type=int, default=None, help="bound for the policies that move workers (4; resnet18: cores)"
    )
    parser.add_argument(
        "--hold-s", type=float, default=60.0, help="full runs: C must hold this long at a steady rate (0: no check)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--capacity", type=float, default=None, help="C in req/s, measured by an earlier run (skips measuring it)"
    )
    parser.add_argument(
        "--scores",
        default="moving,scale,overload",
        help="which scores to measure (the others print as nan); overload needs scale",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--decisions", type=Path, default=None, help="write each run's decision log (JSONL) here")
    parser.add_argument(
        "--cpu-pairs",
        type=int,
        default=0,
        help="then the moving trace this many times each for controller and static, in ABBA order: CPU ratios",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server under test too (its `with`)
    quick = args.quick
    setup = Setup(
        cost=Cost(args.a_ms, args.b_ms),
        sla_ms=args.sla_ms,
        workers=args.workers,
        max_workers=args.max_workers or (4 if args.model == "cost" else os.cpu_count() or 1),
        seconds=60.0 if quick else args.seconds,
        short_s=10.0 if quick else 90.0,
        bisect_steps=3 if quick else 5,
        hold_s=0.0 if quick else args.hold_s,
        overload_s=15.0 if quick else 60.0,
        after_s=10.0 if quick else 30.0,
        burst_s=3.0 if quick else 20.0,
        quick=quick,
    )
    policies = args.policies.split(",") if args.policies else list(QUICK_POLICIES if quick else ALL_POLICIES)
    if args.policies == "none":  # with --cpu-pairs: the pairs alone
        policies = []
    unknown = [p for p in policies if p not in ALL_POLICIES]
    if unknown:
        parser.error(f"--policies: unknown {unknown}; expected some of {', '.join(ALL_POLICIES)}")
    scores = frozenset(args.scores.split(","))
    if not scores <= SCORES or not scores or ("overload" in scores and "scale" not in scores):
        parser.error(f"--scores: some of {', '.join(sorted(SCORES))}, and overload only with scale")
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", flush=True)

    log(f"loadavg before: {open('/proc/loadavg').read().split()[:3]}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="controller-bench-") as tmp:
        store = Path(tmp) / "store"
        store.mkdir()
        served = known_cost(Path(tmp), setup.cost) if args.model == "cost" else resnet18(Path(tmp))
        properties = {
            "disable_token_authorization": "true",
            "enable_model_api": "true",
            "default_workers_per_model": "1",
        }
        with EmbeddedServer(store, {}, properties, workdir=Path(tmp) / "server") as server:
            bench = Bench(server, store, setup, served)
            if args.decisions is not None:
                args.decisions.mkdir(parents=True, exist_ok=True)
                bench.decisions = args.decisions.resolve()
            if args.model == "resnet18":
                setup = replace(setup, cost=fit_cost(bench, setup.workers, log))
                bench.setup = setup
            floor = setup.cost.t(1)
            if args.sla_x is not None:
                setup = replace(setup, sla_ms=round(args.sla_x * floor))
                bench.setup = setup
                log(f"SLA P99 {setup.sla_ms:g} ms: {args.sla_x:g} x the batch-1 time ({floor:.1f} ms)")
            if 2 * floor > setup.sla_ms:
                sys.exit(f"SLA {setup.sla_ms:g} ms: below twice the batch-1 time ({floor:.0f} ms) here")
            c = capacity(bench, setup, log) if args.capacity is None else args.capacity
            if args.capacity is not None:
                log(f"capacity C = {c:g} req/s (given)")
            # the policies take turns to go first from one seed to the next: a machine that drifts over the run's
            # minutes (CPU per request moved 10% between two policies with the same batches) favours none of them
            shift = (args.seed - 1) % max(1, len(policies))
            order = policies[shift:] + policies[:shift]
            log(f"order: {', '.join(order)}")
            by_policy = {policy: score(bench, setup, policy, c, args.seed, log, scores) for policy in order}
            rows = [by_policy[policy] for policy in policies]
            pairs = cpu_pairs(bench, setup, c, args.seed, args.cpu_pairs, log) if args.cpu_pairs else None
    print()
    print(f"{served.label}: cost {setup.cost.a_ms:.1f} + {setup.cost.b_ms:.2f}·n ms, {setup.workers} workers, SLA "
          f"P99 {setup.sla_ms:g} ms, C = {c:.0f} req/s, moving trace {setup.seconds:g} s")  # fmt: skip
    print(table(rows))
    if pairs is not None:
        ratios = pairs["ratios"]
        print(
            f"CPU per 1,000 good, controller / static, {len(ratios)} ABBA pairs: median {pairs['median_ratio']:.3f} "
            f"(pairs {', '.join(f'{r:.3f}' for r in ratios)}); batches {pairs['controller_batches']} against "
            f"{pairs['static_batches']}"
        )
    log(f"done; loadavg after: {open('/proc/loadavg').read().split()[:3]}")
    if args.json is not None:  # the rows; with --cpu-pairs, {"rows": [...], "cpu_pairs": {...}}
        out: Any = rows if pairs is None else {"rows": rows, "cpu_pairs": pairs}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
