"""servetune against TorchServe, Triton, LitServe, BentoML, MLServer and Ray Serve: the same models, the same load.

    python benchmarks/vs_peers.py [--peers torchserve,triton,litserve,bentoml,mlserver,ray] [--rounds 2]
                                  [--seconds 20] [--warmup 5] [--engines async,ab] [--quick] [--json FILE]

Each server runs alone (one at a time), as its own documentation recommends for production, from a venv of its own
at a pinned version (benchmarks/peers/venvs.py; all share this interpreter's torch), launched as
benchmarks/peers/servers.py says: workers x 1 torch thread, its own dynamic batching (max batch 8, ~10 ms) for
resnet18, none for the no-op, keep-alive. Rounds interleave the servers (the order rotates each round) so that
drift in the machine hits all; figures are medians over the rounds.

Cases (rows of ``--json``, one per server, case and engine):
- ``noop-c1``, ``noop-c16``: a handler that returns at once, 1 worker, closed loop at concurrency 1 and 16;
- ``noop-open``: open loop (constant rate, latency from each request's intended send) at 90% of that server's own
  open-loop knee in the same round: near its knee, not past it. The knee is measured first: constant rates from 10%
  of the server's noop-c16 throughput up by 1.25× (3 s each) until one is not kept up with (fewer than 97% of the
  sent requests answered per second of the run, a failed request, or P99 over 100 ms: a queue that grows); the knee
  is the last rate kept up with. A closed loop's throughput is no knee for an open loop: 16 clients keep requests
  queued, so one wake-up of a server serves several, while an open loop's requests come one at a time;
- ``resnet18-c16``: ResNet-18 (random weights, seed 0; PIL decode, resize, crop, normalise, forward, top-5),
  2 workers, closed loop at 16;
- ``resnet18-open``: open loop at 80% of the best server's resnet18-c16 throughput in the same round, the same
  rate for every server.

Per row: req/s, P50/P99 ms, ``overhead_ms`` (servetune only: client latency minus the handler time the server
reports, median, c=1), ``cpu_us_per_req`` (CPU of all the server's processes per request), ``rss_mb`` and
``pss_mb`` (all its processes, read from /proc after the closed-loop runs), ``ready_s`` (launch to the first 200
answer), ``others_cores`` (CPU run by processes that are neither the server nor this harness, per second of the
run: other tenants of the machine; printed beside the harness's own CPU, the kernel's interrupt handling (loopback
networking, charged to no process: it grows with the request rate, so a faster server shows more) and the time the
hypervisor took), ``error`` (a server that could not run: the exact error).

Load: servetune's own engine (``async``: closed and open loop) for every case; ``ab`` (Apache Bench, ``ab -k``) as an
independent cross-check of the closed-loop cases. Measure on a quiet machine, and one benchmark at a time:
``flock /tmp/servetune-bench.lock python benchmarks/vs_peers.py``. ``--quick`` checks the harness end to end (every
server, every case, short runs, one round: about 10-15 minutes here); its figures are not results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/: peers/, vs_torchserve
sys.path.insert(0, str(HERE.parent / "examples" / "resnet18"))

from peers.servers import LAUNCHERS, PEERS, SERVERS, Assets, Deployment, Server, needs  # noqa: E402
from peers.venvs import PINS, venv_python  # noqa: E402

from servetune.bench import BenchResult, BenchSpec, run_bench  # noqa: E402
from servetune.hardware import process_memory  # noqa: E402

CASES = ("noop-c1", "noop-c16", "noop-open", "resnet18-c16", "resnet18-open")
NOOP = Deployment("noop", workers=1, batch=1, delay_ms=0)
RESNET = Deployment("resnet18", workers=2, batch=8, delay_ms=10)


@dataclass
class Row:
    server: str
    case: str
    engine: str = "async"
    round: int = 0
    rps: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    overhead_ms: float | None = None
    cpu_us_per_req: float = math.nan
    rss_mb: float = math.nan
    pss_mb: float = math.nan
    ready_s: float = math.nan
    rate: float | None = None  # open loop: the offered rate
    errors: int = 0
    others_cores: float = math.nan
    interrupt_cores: float = math.nan  # the kernel's irq + softirq (loopback networking), charged to no process
    steal_cores: float = math.nan
    client_cores: float = math.nan  # this harness, the load engine with it
    loadavg: float = math.nan
    error: str | None = None


@dataclass
class Settings:
    seconds: float
    warmup: float
    engines: list[str]
    noop_open_fraction: float = 0.9  # of the server's open-loop knee
    resnet_open_fraction: float = 0.8
    rows: list[Row] = field(default_factory=list)


# ---- assets -------------------------------------------------------------------------------------------------------


def build_assets(work: Path) -> Assets:
    """noop.mar and resnet18.mar (servetune's archiver; resnet18 behind the built-in image_classifier),
    ts-resnet18.mar (TorchServe's archiver; its image_classifier needs captum, so the vs_torchserve handler that does
    the same), and the peers' model folder: model.py, resnet18.pt (seed 0), index_to_name.json; the input image."""
    import torch
    from make_archive import build, sample_image
    from model import ResNet18
    from vs_torchserve import NOOP_HANDLER, RESNET_HANDLER

    from servetune.archive import create_archive

    store, model_dir = work / "store", work / "model"
    store.mkdir()
    model_dir.mkdir()
    handler = work / "noop_handler.py"
    handler.write_text(NOOP_HANDLER)
    create_archive(model_name="noop", version="1.0", handler=str(handler), export_path=str(store), force=True)
    build(store)
    torch.manual_seed(0)
    torch.save(ResNet18().eval().state_dict(), model_dir / "resnet18.pt")
    (model_dir / "index_to_name.json").write_text(json.dumps({str(i): f"class_{i}" for i in range(1000)}))
    shutil.copy(HERE.parent / "examples" / "resnet18" / "model.py", model_dir / "model.py")
    (work / "resnet_handler.py").write_text(RESNET_HANDLER)
    create_archive(
        model_name="ts-resnet18",
        version="1.0",
        handler=str(work / "resnet_handler.py"),
        model_file=str(model_dir / "model.py"),
        serialized_file=str(model_dir / "resnet18.pt"),
        extra_files=[str(model_dir / "index_to_name.json")],
        export_path=str(store),
        force=True,
    )
    text = work / "hello.txt"
    text.write_bytes(b"hello")
    return Assets(store, model_dir, sample_image(work / "sample.png"), text)


# ---- measuring ----------------------------------------------------------------------------------------------------


def tree_cpu_s(server: Server) -> float:
    total = 0.0
    for p in server.processes():
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def tree_memory_mb(server: Server) -> tuple[float, float]:
    rss = pss = 0
    for p in server.processes():
        r, s = process_memory(p.pid)
        rss += r
        pss += s if s is not None else r
    return rss / 2**20, pss / 2**20


@dataclass(frozen=True)
class HostCpu:
    """The machine's CPU seconds so far, split as a run's rows report them: time run by processes (user, nice,
    system: what the server, this harness and other tenants use), the kernel's interrupt handling (irq, softirq:
    mostly loopback networking, charged to no process, so growing with the request rate of the server measured),
    and time the hypervisor took (steal)."""

    processes: float
    interrupts: float
    steal: float

    @classmethod
    def now(cls) -> HostCpu:
        t = psutil.cpu_times()
        return cls(
            float(t.user + t.nice + t.system),
            float(getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)),
            float(getattr(t, "steal", 0.0)),
        )


def harness_cpu_s() -> float:
    """This process's CPU (every thread: the load engine's, the main thread's work on its results) and its reaped
    children's (``ab``)."""
    t = psutil.Process().cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def overhead_ms(result: BenchResult) -> float | None:
    """Median of client latency minus the handler time servetune reports (X-Servetune-Handler-Ms)."""
    rec = result.samples
    if rec is None:
        return None
    values = [lat - h for lat, h in zip(rec.latency_ms, rec.handler_ms, strict=True) if h == h]
    return statistics.median(values) if values else None


def measure(
    server: Server, case: str, settings: Settings, *, concurrency: int | None, rate: float | None, engine: str
) -> Row:
    spec = BenchSpec(
        url=server.url(),
        input=server.body_file,
        content_type=server.content_type,
        concurrency=concurrency,
        rate=rate,
        duration=settings.seconds,
        engine=engine,
    )
    if settings.warmup:
        run_bench(dataclasses.replace(spec, duration=settings.warmup))
    cpu0, host0, own0, t0 = tree_cpu_s(server), HostCpu.now(), harness_cpu_s(), time.monotonic()
    result = run_bench(spec)
    cpu1, host1, own1, wall = tree_cpu_s(server), HostCpu.now(), harness_cpu_s(), time.monotonic() - t0
    served = cpu1 - cpu0
    others = max(0.0, host1.processes - host0.processes - served - (own1 - own0)) / wall
    lat = result.latency
    row = Row(
        server.name,
        case,
        engine,
        rps=result.throughput_rps,
        p50_ms=lat.p50_ms if lat else math.nan,
        p99_ms=lat.p99_ms if lat else math.nan,
        cpu_us_per_req=served / max(1, result.succeeded) * 1e6,
        ready_s=server.ready_s,
        rate=rate,
        errors=result.failed,
        others_cores=others,
        interrupt_cores=(host1.interrupts - host0.interrupts) / wall,
        steal_cores=(host1.steal - host0.steal) / wall,
        client_cores=(own1 - own0) / wall,
        loadavg=os.getloadavg()[0],
    )
    if server.name == "servetune" and case == "noop-c1" and engine == "async":
        row.overhead_ms = overhead_ms(result)
    if result.failed:
        row.error = f"{result.failed} failed requests: {dict(list(result.errors.items())[:3])}"
    return row


KNEE_STEP_S = 3.0
KNEE_P99_MS = 100.0
KNEE_TRIES = 2  # a rate is not kept up with only when this many steps in a row say so


def open_knee(server: Server, start: float) -> float:
    """The highest constant open-loop rate the server keeps up with: from ``start`` up by 1.25x, ``KNEE_STEP_S``
    each, until a rate gets fewer than 97% of its requests answered per second, a failure, or a P99 over
    ``KNEE_P99_MS`` (the queue grows) in ``KNEE_TRIES`` steps in a row; ``start`` itself when even that is not kept
    up with. A second try: one stall of the host (steal) in a 3 s step ended servetune's search at 507-736 req/s
    where it keeps up with 2,700 (docs/peers.md); every server gets the same second try."""
    rate, kept = max(1.0, start), 0.0
    for _ in range(16):
        keeps = False
        for _attempt in range(KNEE_TRIES):
            spec = BenchSpec(url=server.url(), input=server.body_file, content_type=server.content_type, rate=rate,
                             duration=KNEE_STEP_S)  # fmt: skip
            result = run_bench(spec)
            p99 = result.latency.p99_ms if result.latency else math.inf
            keeps = not result.failed and result.throughput_rps >= 0.97 * rate and p99 <= KNEE_P99_MS
            print(f"  {server.name:<10} knee search   {rate:9.0f}/s -> {result.throughput_rps:9.1f} req/s, p99 "
                  f"{p99:8.2f} ms: {'kept up' if keeps else 'not kept up'}", flush=True)  # fmt: skip
            if keeps:
                break
        if not keeps:
            break
        kept, rate = rate, rate * 1.25
    return kept or max(1.0, start)


def say(row: Row) -> None:
    rate = f" at {row.rate:.0f}/s" if row.rate else ""
    print(
        f"  {row.server:<10} {row.case:<14} {row.engine:<5}{rate:>11} {row.rps:9.1f} req/s  p50 {row.p50_ms:8.2f}  "
        f"p99 {row.p99_ms:8.2f} ms  cpu {row.cpu_us_per_req:7.0f} us/req  mem {row.rss_mb:6.0f}/{row.pss_mb:<6.0f} MB  "
        f"ready {row.ready_s:5.1f} s  others {row.others_cores:4.2f} cores (client {row.client_cores:4.2f}, "
        f"irq {row.interrupt_cores:4.2f}, steal {row.steal_cores:4.2f})  load {row.loadavg:4.1f}"
        + (f"  ERROR {row.error}" if row.error else ""),
        flush=True,
    )


def failed(name: str, cases: list[str], exc: BaseException, round_: int) -> list[Row]:
    message = f"{type(exc).__name__}: {exc}"
    print(f"  {name}: could not run: {message}", flush=True)
    return [Row(name, case, round=round_, error=message) for case in cases]


def serving(name: str, deployment: Deployment, assets: Assets) -> Server:
    missing = needs(name)
    if missing:
        raise RuntimeError(missing)
    python = None if name == "servetune" else venv_python(name)
    for attempt in (1, 2):  # one retry: a start can fail on a race of the server's own (PyTriton's handshake)
        server = LAUNCHERS[name](deployment, assets, python)
        try:
            server.start()
            return server
        except RuntimeError as exc:
            if attempt == 2:
                raise
            print(f"  {name}: start failed, once more: {str(exc).splitlines()[0][:200]}", flush=True)
    raise AssertionError("unreachable")


def run_noop(name: str, assets: Assets, settings: Settings, round_: int) -> list[Row]:
    cases = ["noop-c1", "noop-c16", "noop-open"]
    try:
        server = serving(name, NOOP, assets)
    except Exception as exc:  # a peer that cannot run is a row with its error, not the end of the run
        return failed(name, cases, exc, round_)
    rows: list[Row] = []
    try:
        for engine in settings.engines:
            rows.append(measure(server, "noop-c1", settings, concurrency=1, rate=None, engine=engine))
            rows.append(measure(server, "noop-c16", settings, concurrency=16, rate=None, engine=engine))
        c16 = next(r for r in rows if r.case == "noop-c16" and r.engine == "async")
        rss, pss = tree_memory_mb(server)
        rate = max(1.0, settings.noop_open_fraction * open_knee(server, 0.1 * c16.rps))
        rows.append(measure(server, "noop-open", settings, concurrency=None, rate=rate, engine="async"))
        for row in rows:
            row.rss_mb, row.pss_mb, row.round = rss, pss, round_
            say(row)
    except Exception as exc:
        print(traceback.format_exc())
        rows = failed(name, cases, exc, round_)
    finally:
        server.stop()
    return rows


def run_resnet_closed(name: str, assets: Assets, settings: Settings, round_: int) -> list[Row]:
    try:
        server = serving(name, RESNET, assets)
    except Exception as exc:
        return failed(name, ["resnet18-c16"], exc, round_)
    rows: list[Row] = []
    try:
        for engine in settings.engines:
            rows.append(measure(server, "resnet18-c16", settings, concurrency=16, rate=None, engine=engine))
        rss, pss = tree_memory_mb(server)
        for row in rows:
            row.rss_mb, row.pss_mb, row.round = rss, pss, round_
            say(row)
    except Exception as exc:
        print(traceback.format_exc())
        rows = failed(name, ["resnet18-c16"], exc, round_)
    finally:
        server.stop()
    return rows


def run_resnet_open(name: str, assets: Assets, settings: Settings, round_: int, rate: float) -> list[Row]:
    try:
        server = serving(name, RESNET, assets)
    except Exception as exc:
        return failed(name, ["resnet18-open"], exc, round_)
    try:
        row = measure(server, "resnet18-open", settings, concurrency=None, rate=rate, engine="async")
        row.rss_mb, row.pss_mb = tree_memory_mb(server)
        row.round = round_
        say(row)
        return [row]
    except Exception as exc:
        print(traceback.format_exc())
        return failed(name, ["resnet18-open"], exc, round_)
    finally:
        server.stop()


# ---- report -------------------------------------------------------------------------------------------------------


def med(rows: list[Row], key: Callable[[Row], float | None]) -> float:
    values = [v for v in (key(r) for r in rows) if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def summary(rows: list[Row], servers: list[str]) -> list[dict[str, Any]]:
    """One row per server, case and engine: medians over the rounds (``error``: the first error, if every round
    failed)."""
    out = []
    for case in CASES:
        for engine in ("async", "ab"):
            for name in servers:
                mine = [r for r in rows if r.server == name and r.case == case and r.engine == engine]
                if not mine:
                    continue
                good = [r for r in mine if r.error is None]
                out.append(
                    {
                        "server": name,
                        "case": case,
                        "engine": engine,
                        "rounds": len(good),
                        "rps": med(good, lambda r: r.rps),
                        "p50_ms": med(good, lambda r: r.p50_ms),
                        "p99_ms": med(good, lambda r: r.p99_ms),
                        "overhead_ms": med(good, lambda r: r.overhead_ms) if name == "servetune" else None,
                        "cpu_us_per_req": med(good, lambda r: r.cpu_us_per_req),
                        "rss_mb": med(good, lambda r: r.rss_mb),
                        "pss_mb": med(good, lambda r: r.pss_mb),
                        "ready_s": med(good, lambda r: r.ready_s),
                        "rate": med(good, lambda r: r.rate),
                        "others_cores_max": max((r.others_cores for r in good), default=math.nan),
                        "error": None if good else mine[0].error,
                    }
                )
    return out


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(summary_rows: list[dict[str, Any]], servers: list[str]) -> str:
    """The docs/peers.md table: a column per server, a line per figure (async engine; ab's req/s beside)."""

    def get(name: str, case: str, engine: str = "async") -> dict[str, Any] | None:
        return next(
            (r for r in summary_rows if r["server"] == name and r["case"] == case and r["engine"] == engine), None
        )

    def cell(name: str, render: Callable[[Callable[[str, str], dict[str, Any] | None]], str]) -> str:
        rows = [r for r in summary_rows if r["server"] == name]
        if rows and all(r["error"] for r in rows):
            return "could not run"
        return render(lambda case, engine="async": get(name, case, engine))

    lines = {
        "resnet18, closed loop c=16: req/s (P99 ms)": lambda g: (
            f"{fmt((g('resnet18-c16') or {}).get('rps'), '.1f')} "
            f"({fmt((g('resnet18-c16') or {}).get('p99_ms'), '.0f')})"
        ),
        "resnet18, closed loop c=16, ab -k: req/s": lambda g: fmt((g("resnet18-c16", "ab") or {}).get("rps"), ".1f"),
        "resnet18, open loop (same rate for all): P50 / P99 ms": lambda g: (
            f"{fmt((g('resnet18-open') or {}).get('p50_ms'), '.0f')} / "
            f"{fmt((g('resnet18-open') or {}).get('p99_ms'), '.0f')}"
        ),
        "no-op, 1 worker: c=1 P50 ms; c=16 req/s": lambda g: (
            f"{fmt((g('noop-c1') or {}).get('p50_ms'), '.2f')}; {fmt((g('noop-c16') or {}).get('rps'), ',.0f')}"
        ),
        "no-op, c=16, ab -k: req/s": lambda g: fmt((g("noop-c16", "ab") or {}).get("rps"), ",.0f"),
        "no-op, open loop at 90% of its own knee: rate; P50 / P99 ms": lambda g: (
            f"{fmt((g('noop-open') or {}).get('rate'), ',.0f')}; {fmt((g('noop-open') or {}).get('p50_ms'), '.2f')} / "
            f"{fmt((g('noop-open') or {}).get('p99_ms'), '.1f')}"
        ),
        "no-op c=16: server CPU per request (us, all processes)": lambda g: fmt(
            (g("noop-c16") or {}).get("cpu_us_per_req"), ".0f"
        ),
        "resnet18: ready after start (s); RSS / PSS of all processes (MB)": lambda g: (
            f"{fmt((g('resnet18-c16') or {}).get('ready_s'), '.1f')}; "
            f"{fmt((g('resnet18-c16') or {}).get('rss_mb'), ',.0f')} / "
            f"{fmt((g('resnet18-c16') or {}).get('pss_mb'), ',.0f')}"
        ),
        "no-op: ready (s); RSS / PSS (MB)": lambda g: (
            f"{fmt((g('noop-c16') or {}).get('ready_s'), '.1f')}; "
            f"{fmt((g('noop-c16') or {}).get('rss_mb'), ',.0f')} / {fmt((g('noop-c16') or {}).get('pss_mb'), ',.0f')}"
        ),
    }
    out = ["| case | " + " | ".join(servers) + " |", "|---|" + "---|" * len(servers)]
    for label, render in lines.items():
        out.append(f"| {label} | " + " | ".join(cell(name, render) for name in servers) + " |")
    return "\n".join(out)


def targets(summary_rows: list[dict[str, Any]], servers: list[str]) -> list[str]:
    """The issue's targets, servetune against the best peer of the same run."""

    def value(name: str, case: str, key: str) -> float:
        """A server's figure for a case; for resnet18's memory and start (the same deployment started for both of
        its cases), the median over both cases' rows."""
        cases = ("resnet18-c16", "resnet18-open") if case == "resnet18" else (case,)
        values = [
            float(r[key])
            for r in summary_rows
            if r["server"] == name
            and r["case"] in cases
            and r["engine"] == "async"
            and r.get(key) is not None
            and not math.isnan(float(r[key]))
        ]
        return statistics.median(values) if values else math.nan

    peers = [s for s in servers if s != "servetune"]
    out = []

    def check(label: str, mine: float, theirs: list[float], goal: Callable[[float, float], bool], best: str) -> None:
        theirs = [t for t in theirs if not math.isnan(t)]
        if not theirs or math.isnan(mine):
            out.append(f"  {label}: not measured")
            return
        ref = min(theirs) if best == "min" else max(theirs)
        verdict = "met" if goal(mine, ref) else "NOT met"
        out.append(f"  {label}: servetune {mine:.3g}, best peer {ref:.3g} (ratio {mine / ref:.2f})  {verdict}")

    check(
        "no-op RSS <= 1.1x lowest peer",
        value("servetune", "noop-c16", "rss_mb"),
        [value(p, "noop-c16", "rss_mb") for p in peers],
        lambda m, r: m <= 1.1 * r,
        "min",
    )
    check(
        "no-op PSS <= lowest peer",
        value("servetune", "noop-c16", "pss_mb"),
        [value(p, "noop-c16", "pss_mb") for p in peers],
        lambda m, r: m <= r,
        "min",
    )
    check(
        "resnet18 PSS <= 0.9x lowest peer",
        value("servetune", "resnet18", "pss_mb"),
        [value(p, "resnet18", "pss_mb") for p in peers],
        lambda m, r: m <= 0.9 * r,
        "min",
    )
    for case, label in (("noop-c16", "no-op"), ("resnet18", "resnet18")):
        check(
            f"{label} ready <= fastest peer",
            value("servetune", case, "ready_s"),
            [value(p, case, "ready_s") for p in peers],
            lambda m, r: m <= r,
            "min",
        )
    check(
        "no-op c=16 req/s >= 2.5x best peer",
        value("servetune", "noop-c16", "rps"),
        [value(p, "noop-c16", "rps") for p in peers],
        lambda m, r: m >= 2.5 * r,
        "max",
    )
    check(
        "no-op c=1 P50 <= 0.6x best peer",
        value("servetune", "noop-c1", "p50_ms"),
        [value(p, "noop-c1", "p50_ms") for p in peers],
        lambda m, r: m <= 0.6 * r,
        "min",
    )
    check(
        "resnet18 c=16 req/s >= 1.03x best peer",
        value("servetune", "resnet18-c16", "rps"),
        [value(p, "resnet18-c16", "rps") for p in peers],
        lambda m, r: m >= 1.03 * r,
        "max",
    )
    check(
        "resnet18 c=16 P99 the lowest",
        value("servetune", "resnet18-c16", "p99_ms"),
        [value(p, "resnet18-c16", "p99_ms") for p in peers],
        lambda m, r: m <= r,
        "min",
    )
    check(
        "resnet18 open-loop P99 the lowest",
        value("servetune", "resnet18-open", "p99_ms"),
        [value(p, "resnet18-open", "p99_ms") for p in peers],
        lambda m, r: m <= r,
        "min",
    )
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} CPUs ({cpu}), {memory:.0f} GiB, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; quick 1)")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per run (default 20; quick 3)")
    parser.add_argument(
        "--warmup", type=float, default=None, help="warm-up seconds before each run (default 5; quick 1)"
    )
    parser.add_argument("--engines", default=None, help="async and/or ab for the closed-loop cases (default async,ab)")
    parser.add_argument("--quick", action="store_true", help="check the harness end to end: short runs, one round")
    parser.add_argument("--json", type=Path, help="write the rows (medians over the rounds) here, as a JSON list")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server under test too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    cases = [c for c in args.cases.split(",") if c]
    if unknown or not set(cases) <= set(CASES):
        raise SystemExit(f"unknown peer(s) or case(s): {unknown or sorted(set(cases) - set(CASES))}")
    servers = [s for s in SERVERS if s == "servetune" or s in peers]
    engines = (args.engines or ("async" if args.quick else "async,ab")).split(",")
    if "ab" in engines and shutil.which("ab") is None:
        raise SystemExit("engine ab needs Apache Bench: apt-get install apache2-utils (or --engines async)")
    settings = Settings(
        seconds=args.seconds or (3.0 if args.quick else 20.0),
        warmup=args.warmup if args.warmup is not None else (1.0 if args.quick else 5.0),
        engines=engines,
    )
    rounds = args.rounds or (1 if args.quick else 2)
    versions = {p: PINS[p][0] for p in peers}
    print(f"{time.strftime('%Y-%m-%d')}; {machine()}; load average {os.getloadavg()[0]:.2f}")
    print(f"peers: {versions}; {settings.seconds:g} s runs, {settings.warmup:g} s warm-up, {rounds} round(s)")
    for name in peers:  # build the venvs first (once per machine), so that no round pays for it
        try:
            venv_python(name)
        except Exception as exc:
            print(f"  {name}: no venv: {exc}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="vs-peers-") as tmp:
        assets = build_assets(Path(tmp))
        for r in range(rounds):
            order = servers[r % len(servers) :] + servers[: r % len(servers)]  # a different server goes first
            print(f"\nround {r + 1}: {', '.join(order)}", flush=True)
            if {"noop-c1", "noop-c16", "noop-open"} & set(cases):
                for name in order:
                    rows += [x for x in run_noop(name, assets, settings, r) if x.case in cases]
            closed: list[Row] = []
            if {"resnet18-c16", "resnet18-open"} & set(cases):
                for name in order:
                    closed += run_resnet_closed(name, assets, settings, r)
                rows += closed
            if "resnet18-open" in cases:
                best = max((x.rps for x in closed if x.error is None and x.engine == "async"), default=math.nan)
                if math.isnan(best):
                    print("  resnet18-open: no server's capacity measured this round")
                else:
                    rate = settings.resnet_open_fraction * best
                    print(f"  resnet18-open at {rate:.1f} req/s ({settings.resnet_open_fraction:.0%} of {best:.1f})")
                    for name in order:
                        rows += run_resnet_open(name, assets, settings, r, rate)
    result = summary(rows, servers)
    print(f"\nmedians over {rounds} round(s); servers one at a time; async engine unless said\n")
    print(table(result, servers))
    print("\ntargets (servetune against the best peer of this run):")
    print("\n".join(targets(result, servers)))
    errors = {r["server"]: r["error"] for r in result if r["error"]}
    for name, error in errors.items():
        print(f"\n{name} could not run: {error}")
    if args.json:
        keys = ("server", "case", "rps", "p50_ms", "p99_ms", "overhead_ms", "cpu_us_per_req", "rss_mb", "pss_mb")
        out = [
            {
                **{k: r[k] for k in keys},
                "ready_s": r["ready_s"],
                "error": r["error"],
                "engine": r["engine"],
                "rounds": r["rounds"],
                "rate": r["rate"],
                "others_cores_max": r["others_cores_max"],
            }
            for r in result
        ]
        clean = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in out]
        args.json.write_text(json.dumps(clean, indent=1))
        print(f"\nrows written to {args.json}")


if __name__ == "__main__":
    main()
