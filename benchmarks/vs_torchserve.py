"""servetune against TorchServe 0.12 in one run: the same archives, workers, batching and threads, the same load.

    python benchmarks/vs_torchserve.py [--seconds 10] [--repeats 3] [--cases noop-c1,noop-c16,resnet18]
                                       [--engines ab,async] [--quick]

Cases: ``noop-c1`` and ``noop-c16``, a handler that returns at once (1 worker, batch 1) at concurrency 1 and 16;
``resnet18``, ResNet-18 with random weights behind the built-in ``image_classifier`` handler (examples/resnet18),
2 workers x 1 thread, batch 4, max batch delay 20 ms, concurrency 16. Both archives are built with TorchServe's
own ``torch-model-archiver`` and both servers load the same .mar files from the same model store.

Engines: ``ab`` is servetune.bench's Apache Bench engine, i.e. TorchServe's benchmark method
(``ab -k -c C -s T -t SECONDS -n 2000000 -p BODY -T TYPE URL`` after an ``ab`` warm-up); ``async`` is servetune's
built-in engine. Every run is closed-loop, with a warm-up excluded from the figures.

How TorchServe is run (torchserve==0.12.0 and torch-model-archiver==0.12.0 from PyPI; Java 17 from Debian's
openjdk-17-jre-headless at /usr/bin/java, found on PATH since JAVA_HOME is unset):

    torchserve --start --foreground --ncs --disable-token-auth --model-store STORE --ts-config CONFIG
               --log-config LOG4J2 --models NAME=NAME.mar

- cwd is a fresh temp dir (TorchServe writes logs/ there); TEMP and TMPDIR point into it, so the JVM's
  java.io.tmpdir (the workers' unix sockets ``.ts.sock.<port>``) and the launcher's ``.model_server.pid`` are
  private to this run; the process starts in a session of its own; its output goes to a file in the temp dir.
- config.properties: loopback addresses on free ports (gRPC too), ``disable_token_authorization=true``,
  ``default_workers_per_model=W``, ``number_of_netty_threads=0`` and ``netty_client_threads=0`` (Netty's
  default: one per logical CPU), ``job_queue_size=1000``, ``metrics_mode=prometheus`` (in memory; the default
  ``log`` mode writes every metric to a file), ``disable_system_metrics=true`` (no collector process every minute),
  ``async_logging=true``, and ``models=`` with minWorkers = maxWorkers = W, batchSize, maxBatchDelay.
- LOG4J2: WARN and above to one file; no access log, no per-request model/metrics log lines (TorchServe's own
  log4j2.xml logs every request and DEBUG for org.pytorch.serve). ``--torchserve-logs default`` keeps TorchServe's.
- threads: TorchServe does not set a worker's thread count (WorkerLifeCycle sets OMP_NUM_THREADS only for
  torchrun models); workers inherit the frontend's environment, so OMP_NUM_THREADS and MKL_NUM_THREADS are set to
  the case's threads per worker in TorchServe's environment. servetune gets ``threads_per_worker`` (its workers'
  OMP/MKL variables and torch.set_num_threads).
- ready: when ``GET /models/NAME`` on the management API lists W workers, all READY, and ``/ping`` is Healthy.
- stop: SIGTERM to the Java frontend (what ``torchserve --stop`` does; its shutdown hook stops its Python workers),
  wait up to 60 s for the launcher to exit, then SIGKILL whatever is left of the processes it started (its process
  group, and any process of its tree seen while it ran); the temp dir is removed.

servetune runs through servetune.embedded.EmbeddedServer with the same ``models=`` JSON, ``job_queue_size`` and
threads. Both servers of a case run side by side; the idle one's CPU during the other's runs is reported.
Runs alternate A B, B A, A B, ... per engine, so drift in the machine's load hits both. Each run records the CPU
that processes other than the two servers and the client used meanwhile (a pair where they used 0.25 of a core or
more is contended). The table gives medians over the repeats and the ratio of the medians; below it, each figure
with a target as mean, median and tail (the worst pair) of the per-pair ratios, and a verdict that is "no verdict"
when the pairs disagree about the target (contended pairs left out when two clean ones remain:
``servetune.bench.repeats``).

Targets: no-op req/s at c=16 >= 1.5x TorchServe; servetune's frontend overhead at c=1 (client latency minus the
handler time in ``X-Servetune-Handler-Ms``, async engine) < 0.5 ms median; resnet18 req/s >= 1.05x TorchServe.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import nan
from pathlib import Path
from typing import Any

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "resnet18"))

from make_archive import sample_image  # noqa: E402

from servetune.bench import BenchResult, BenchSpec, run_bench  # noqa: E402
from servetune.bench.host import CONTENDED_CORES  # noqa: E402
from servetune.bench.repeats import spread as spread_of  # noqa: E402
from servetune.bench.repeats import verdict as verdict_of  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402

NOOP_HANDLER = '''
def handle(data, context):
    """Return at once: what is measured is the server around the handler."""
    if data is None:
        return None
    return ["OK"] * len(data)
'''

# TorchServe's own image_classifier imports captum (vision_handler.py), which is not installed here and is no
# dependency of the torchserve package; both servers therefore run this file, which does what image_classifier does.
RESNET_HANDLER = '''
import io
import json
import os

import torch
from PIL import Image
from torchvision import transforms


class ResNetClassifier:
    """TorchServe's image_classifier pipeline: PIL decode, Resize 256, CenterCrop 224, normalise, forward, top-5."""

    def initialize(self, context):
        from model import ResNet18  # the archive's model file; both servers put the model dir on sys.path

        model_dir = context.system_properties["model_dir"]
        self.model = ResNet18().eval()
        weights = torch.load(os.path.join(model_dir, "resnet18.pt"), map_location="cpu", weights_only=True)
        self.model.load_state_dict(weights)
        with open(os.path.join(model_dir, "index_to_name.json")) as fh:
            self.labels = json.load(fh)
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        self.transform = transforms.Compose(
            [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]
        )

    def handle(self, data, context):
        images = [self.transform(Image.open(io.BytesIO(row.get("data") or row.get("body")))) for row in data]
        with torch.inference_mode():
            probs = torch.softmax(self.model(torch.stack(images)), dim=1)
        top_p, top_i = torch.topk(probs, 5, dim=1)
        return [
            {self.labels[str(i)]: p for i, p in zip(ids, ps)} for ids, ps in zip(top_i.tolist(), top_p.tolist())
        ]
'''

QUIET_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders>
    <File name="ts_log" fileName="${env:LOG_LOCATION:-logs}/ts_log.log">
      <PatternLayout pattern="%d{ISO8601} [%-5p] %t %c - %m%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="ACCESS_LOG" level="off"/>
    <Logger name="MODEL_METRICS" level="off"/>
    <Logger name="TS_METRICS" level="off"/>
    <Logger name="io.netty" level="error"/>
    <Logger name="org.apache" level="off"/>
    <Root level="warn"><AppenderRef ref="ts_log"/></Root>
  </Loggers>
</Configuration>
"""


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    concurrency: int
    workers: int
    batch: int
    delay_ms: int
    threads: int

    def models_json(self) -> str:
        entry = {
            "defaultVersion": True,
            "marName": f"{self.model}.mar",
            "minWorkers": self.workers,
            "maxWorkers": self.workers,
            "batchSize": self.batch,
            "maxBatchDelay": self.delay_ms,
            "responseTimeout": 120,
        }
        return json.dumps({self.model: {"1.0": entry}})


CASES = {
    "noop-c1": Case("noop-c1", "noop", 1, 1, 1, 100, 1),
    "noop-c16": Case("noop-c16", "noop", 16, 1, 1, 100, 1),
    "resnet18": Case("resnet18", "resnet18", 16, 2, 4, 20, 1),
}
SERVERS = ("servetune", "torchserve")


# ---- archives -------------------------------------------------------------------------------------------------------


def archive(store: Path, name: str, handler: str, *extra: str) -> Path:
    cmd = ["torch-model-archiver", "--model-name", name, "--version", "1.0", "--handler", handler]
    subprocess.run([*cmd, *extra, "--export-path", str(store), "--force"], check=True)
    return store / f"{name}.mar"


def build_archives(store: Path, work: Path, resnet_handler: str = "shared") -> None:
    """noop.mar and resnet18.mar, by torch-model-archiver, into ``store``; resnet18's handler is RESNET_HANDLER
    (``shared``) or each server's built-in ``image_classifier`` (``builtin``: TorchServe's needs captum)."""
    store.mkdir(parents=True, exist_ok=True)
    handler = work / "noop_handler.py"
    handler.write_text(NOOP_HANDLER)
    archive(store, "noop", str(handler))
    from model import ResNet18

    torch.manual_seed(0)
    weights = work / "resnet18.pt"
    torch.save(ResNet18().eval().state_dict(), weights)
    labels = work / "index_to_name.json"
    labels.write_text(json.dumps({str(i): f"class_{i}" for i in range(1000)}))
    model_file = str(ROOT / "examples" / "resnet18" / "model.py")
    extra = ["--model-file", model_file, "--serialized-file", str(weights), "--extra-files", str(labels)]
    handler = work / "resnet_handler.py"
    handler.write_text(RESNET_HANDLER)
    archive(store, "resnet18", "image_classifier" if resnet_handler == "builtin" else str(handler), *extra)


# ---- the two servers ------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class TorchServe:
    """TorchServe 0.12 started as the module docstring says, stopped with every process it started."""

    def __init__(
        self, store: Path, case: Case, default_logs: bool = False, overrides: dict[str, str] | None = None
    ) -> None:
        self.store = store
        self.case = case
        self.default_logs = default_logs
        self._tmp = tempfile.TemporaryDirectory(prefix="vs-torchserve-")
        self.dir = Path(self._tmp.name)
        ports = {key: free_port() for key in ("inference", "management", "metrics", "grpc_i", "grpc_m")}
        self.inference_url = f"http://127.0.0.1:{ports['inference']}"
        self.management_url = f"http://127.0.0.1:{ports['management']}"
        self.metrics_url = f"http://127.0.0.1:{ports['metrics']}"
        self.properties = {
            "inference_address": self.inference_url,
            "management_address": self.management_url,
            "metrics_address": self.metrics_url,
            "grpc_inference_port": str(ports["grpc_i"]),
            "grpc_management_port": str(ports["grpc_m"]),
            "disable_token_authorization": "true",
            "default_workers_per_model": str(case.workers),
            "number_of_netty_threads": "1",
            "netty_client_threads": "0",
            "job_queue_size": "1000",
            "metrics_mode": "prometheus",
            "disable_system_metrics": "true",
            "async_logging": "true",
            "models": case.models_json(),
            **(overrides or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, psutil.Process] = {}

    def start(self, timeout: float = 300.0) -> TorchServe:
        config = self.dir / "config.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties.items()))
        cmd = ["torchserve", "--start", "--foreground", "--ncs", "--disable-token-auth"]
        cmd += ["--model-store", str(self.store), "--ts-config", str(config)]
        if not self.default_logs:
            (self.dir / "log4j2.xml").write_text(QUIET_LOG4J2)
            cmd += ["--log-config", str(self.dir / "log4j2.xml")]
        cmd += ["--models", f"{self.case.model}={self.case.model}.mar"]
        (self.dir / "tmp").mkdir()
        threads = str(self.case.threads)
        env = {**os.environ, "TEMP": str(self.dir / "tmp"), "TMPDIR": str(self.dir / "tmp")}
        env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
        with open(self.dir / "output.log", "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=self.dir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            self._remember()
            if self._ready():
                return self
            time.sleep(0.5)
        tail = (self.dir / "output.log").read_text(errors="replace")[-3000:]
        self.stop()
        raise SystemExit(f"TorchServe did not become ready:\n{tail}")

    def _ready(self) -> bool:
        try:
            described = get_json(f"{self.management_url}/models/{self.case.model}")
            workers = described[0].get("workers", [])
            ping = get_json(f"{self.inference_url}/ping")
        except (OSError, ValueError, IndexError):
            return False
        ready = [w for w in workers if w.get("status") == "READY"]
        return len(ready) >= self.case.workers and ping.get("status") == "Healthy"

    def _remember(self) -> None:
        """Note every process of TorchServe's tree, so that none can outlive stop()."""
        if self.proc is None:
            return
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def frontend(self) -> psutil.Process | None:
        """The Java process (the launcher's child)."""
        self._remember()
        for p in self.seen.values():
            try:
                if p.is_running() and p.name() == "java":
                    return p
            except psutil.NoSuchProcess:
                continue
        return None

    def stop(self) -> None:
        if self.proc is not None:
            self._remember()
            java = self.frontend()
            if java is not None:
                java.terminate()  # what `torchserve --stop` does
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            for p in self.seen.values():
                try:
                    if p.is_running():
                        p.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc = None
        self._tmp.cleanup()

    def __enter__(self) -> TorchServe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def servetune(store: Path, case: Case) -> EmbeddedServer:
    properties = {
        "disable_token_authorization": "true",
        "default_workers_per_model": str(case.workers),
        "threads_per_worker": str(case.threads),
        "job_queue_size": "1000",
        "models": case.models_json(),
    }
    return EmbeddedServer(store, {case.model: f"{case.model}.mar"}, properties)


def tree_cpu(root: psutil.Process | None, frontend: psutil.Process | None) -> tuple[float, float]:
    """(frontend, everything else in the tree) CPU seconds, user + system."""
    if root is None:
        return 0.0, 0.0
    front = rest = 0.0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    for p in procs:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        used = times.user + times.system
        if frontend is not None and p.pid == frontend.pid:
            front += used
        else:
            rest += used
    return front, rest


@dataclass
class Run:
    result: BenchResult
    frontend_cpu_s: float
    worker_cpu_s: float
    idle_other_cpu_s: float
    others_cores: float  # CPU that neither server nor the load client used during the run (other tenants)


class Pair:
    """Both servers of a case, up side by side."""

    def __init__(self, st: EmbeddedServer, ts: TorchServe) -> None:
        self.urls = {"servetune": st.inference_url, "torchserve": ts.inference_url}
        st_proc = psutil.Process(st.proc.pid) if st.proc is not None else None
        ts_root = psutil.Process(ts.proc.pid) if ts.proc is not None else None
        self.roots = {"servetune": (st_proc, st_proc), "torchserve": (ts_root, ts.frontend())}

    def cpu(self, server: str) -> tuple[float, float]:
        root, front = self.roots[server]
        return tree_cpu(root, front)


def busy_cpu_s() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def measure(
    pair: Pair, server: str, case: Case, body: Path, ctype: str, engine: str, seconds: float, warmup: float
) -> Run:
    """A warm-up run, then the measured run; CPU figures cover the measured run only."""
    other = SERVERS[1 - SERVERS.index(server)]
    spec = BenchSpec(
        url=f"{pair.urls[server]}/predictions/{case.model}",
        input=body,
        content_type=ctype,
        concurrency=case.concurrency,
        duration=seconds,
        engine=engine,
    )
    if warmup:
        run_bench(dataclasses.replace(spec, duration=warmup))
    before, other_before, busy_before, start = pair.cpu(server), sum(pair.cpu(other)), busy_cpu_s(), time.monotonic()
    result = run_bench(spec)
    after, other_after, busy_after, wall = (
        pair.cpu(server),
        sum(pair.cpu(other)),
        busy_cpu_s(),
        time.monotonic() - start,
    )
    if result.failed:
        raise SystemExit(f"{server} {case.name} {engine}: {result.failed} failed requests: {result.errors}")
    front, workers, idle = after[0] - before[0], after[1] - before[1], other_after - other_before
    others = busy_after - busy_before - front - workers - idle - result.client.cpu_seconds
    return Run(result, front, workers, idle, max(0.0, others) / wall)


# ---- report ---------------------------------------------------------------------------------------------------------


def overhead_ms(result: BenchResult) -> float:
    """Median of client latency minus the handler time the server reported (X-Servetune-Handler-Ms)."""
    rec = result.samples
    assert rec is not None
    values = [lat - h for lat, h in zip(rec.latency_ms, rec.handler_ms, strict=True) if h == h]
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def contended(*runs: Run) -> bool:
    return any(r.others_cores >= CONTENDED_CORES for r in runs)


def target_line(label: str, values: list[float], flags: list[bool], target: float, higher: bool = True) -> str:
    sign = ">=" if higher else "<"
    return (
        f"  {label}: {spread_of(values, higher).describe(2)}; {sum(flags)} of {len(values)} contended; "
        f"target {sign} {target:g}: {verdict_of(values, target, higher_is_better=higher, contended=flags)}"
    )


def median_of(runs: list[Run], key: Callable[[Run], float]) -> float:
    return statistics.median(key(r) for r in runs)


def report(runs: dict[tuple[str, str, str], list[Run]], cases: list[Case], engines: list[str], seconds: float) -> None:
    print(f"\nmedians of {seconds:g} s runs; ratio = servetune/TorchServe of the medians (pairs: per-pair min-max)")
    print(
        "others: the most CPU (cores) that processes other than the two servers and the client used in a run of the row"
    )
    head = (
        f"{'case':<9} {'engine':<6} {'servetune req/s':>15} {'TorchServe req/s':>16} {'ratio':>6} {'pairs':>10}  "
        f"{'p50 ms st/ts':>13} {'p99 ms st/ts':>15}  {'frontend CPU us/req st/ts':>25} {'client CPU% st/ts':>17}"
    )
    print(head)
    print("-" * len(head))
    ratios: dict[tuple[str, str], tuple[list[float], list[bool]]] = {}
    for case in cases:
        for engine in engines:
            st, ts = runs[(case.name, engine, "servetune")], runs[(case.name, engine, "torchserve")]
            if not st or not ts:
                continue
            rps = [median_of(rs, lambda r: r.result.throughput_rps) for rs in (st, ts)]
            pairs = [a.result.throughput_rps / b.result.throughput_rps for a, b in zip(st, ts, strict=True)]
            p50 = [median_of(rs, lambda r: r.result.latency.p50_ms if r.result.latency else nan) for rs in (st, ts)]
            p99 = [median_of(rs, lambda r: r.result.latency.p99_ms if r.result.latency else nan) for rs in (st, ts)]
            front = [median_of(rs, lambda r: r.frontend_cpu_s / max(1, r.result.succeeded) * 1e6) for rs in (st, ts)]
            client = [median_of(rs, lambda r: r.result.client.cpu_percent) for rs in (st, ts)]
            others = max(r.others_cores for r in (*st, *ts))
            ratios[(case.name, engine)] = (pairs, [contended(a, b) for a, b in zip(st, ts, strict=True)])
            print(
                f"{case.name:<9} {engine:<6} {rps[0]:15.1f} {rps[1]:16.1f} {rps[0] / rps[1]:6.2f} {spread(pairs):>10}  "
                f"{p50[0]:6.2f}/{p50[1]:<6.2f} {p99[0]:7.2f}/{p99[1]:<7.2f}  "
                f"{front[0]:12.0f}/{front[1]:<12.0f} {client[0]:8.0f}/{client[1]:<8.0f} {others:6.2f}"
            )
    idle = [r.idle_other_cpu_s for rs in runs.values() for r in rs]
    if idle:
        print(f"\nCPU used by the idle server during the other's runs: at most {max(idle):.2f} s per run")
    print("\ntargets (per-pair servetune/TorchServe ratios; no verdict when the pairs disagree):")
    for engine in engines:
        if ("noop-c16", engine) in ratios:
            values, flags = ratios[("noop-c16", engine)]
            print(target_line(f"no-op c=16 req/s, {engine}, x TorchServe", values, flags, 1.5))
    c1 = runs.get(("noop-c1", "async", "servetune"), [])
    if c1:
        per_run = [overhead_ms(r.result) for r in c1]
        flags = [contended(r) for r in c1]
        label = "servetune frontend overhead at c=1 (latency - X-Servetune-Handler-Ms, async), ms"
        print(target_line(label, per_run, flags, 0.5, higher=False))
        ts_c1 = runs.get(("noop-c1", "async", "torchserve"), [])
        if ts_c1:
            ts_p50 = median_of(ts_c1, lambda r: r.result.latency.p50_ms if r.result.latency else nan)
            print(f"    (TorchServe reports no handler time; its c=1 p50 latency, no-op handler: {ts_p50:.3f} ms)")
    for engine in engines:
        if ("resnet18", engine) in ratios:
            values, flags = ratios[("resnet18", engine)]
            print(target_line(f"resnet18 req/s, {engine}, x TorchServe", values, flags, 1.05))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per run (default 10; quick 2)")
    parser.add_argument("--warmup", type=float, default=None, help="warm-up seconds before each run (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per server, case and engine (default 3)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--engines", default="ab,async", help="comma-separated, of ab, async")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 2 s runs, 1 s warm-up, 1 repeat (about 2-3.5 minutes; too short for resnet18 figures)",
    )
    parser.add_argument(
        "--torchserve-logs", choices=("quiet", "default"), default="quiet", help="TorchServe's log4j2 config"
    )
    parser.add_argument(
        "--resnet-handler",
        choices=("shared", "builtin"),
        default="shared",
        help="resnet18: one handler file for both servers, or each one's image_classifier (TorchServe's needs captum)",
    )
    parser.add_argument(
        "--torchserve-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of TorchServe's config.properties (repeatable), e.g. number_of_netty_threads=0",
    )
    args = parser.parse_args()
    # Stop cleanly, servers and their workers too, on SIGTERM, and on SIGINT even when started in the background
    # (where the shell leaves SIGINT ignored).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 2.0)
    repeats = args.repeats or (1 if args.quick else 3)
    cases = [CASES[name] for name in args.cases.split(",")]
    ts_overrides = dict(item.split("=", 1) for item in args.torchserve_property)
    engines = args.engines.split(",")
    if "ab" in engines and shutil.which("ab") is None:
        raise SystemExit("engine ab needs Apache Bench: apt-get install apache2-utils (or --engines async)")
    if shutil.which("java") is None or shutil.which("torchserve") is None:
        raise SystemExit("needs java (openjdk-17-jre-headless) and torchserve==0.12.0 on PATH")

    runs: dict[tuple[str, str, str], list[Run]] = {(c.name, e, s): [] for c in cases for e in engines for s in SERVERS}
    print(f"{os.cpu_count()} CPUs; torch {torch.__version__}; {seconds:g} s runs, {warmup:g} s warm-up, x{repeats}")
    with tempfile.TemporaryDirectory(prefix="vs-torchserve-") as tmp:
        store = Path(tmp) / "store"
        build_archives(store, Path(tmp), args.resnet_handler)
        image = sample_image(Path(tmp) / "sample.png")
        text = Path(tmp) / "body.txt"
        text.write_bytes(b"hello")
        for case in cases:
            body, ctype = (image, "image/png") if case.model == "resnet18" else (text, "application/octet-stream")
            print(
                f"\n{case.name}: {case.workers} worker(s) x {case.threads} thread(s), batch {case.batch}, "
                f"delay {case.delay_ms} ms, concurrency {case.concurrency}",
                flush=True,
            )
            st, ts = servetune(store, case), TorchServe(store, case, args.torchserve_logs == "default", ts_overrides)
            with contextlib.ExitStack() as stack:
                stack.callback(st.stop)
                stack.callback(ts.stop)
                with ThreadPoolExecutor(max_workers=2) as pool:  # both start at once: startup is most of --quick
                    starting = [pool.submit(st.start), pool.submit(ts.start)]
                for future in starting:
                    future.result()
                pair = Pair(st, ts)
                for server in SERVERS:  # JIT, caches, first batches: neither server's first run is measured cold
                    measure(pair, server, case, body, ctype, engines[0], warmup * 2, warmup)
                for r in range(repeats):
                    order = SERVERS if r % 2 == 0 else SERVERS[::-1]
                    for engine in engines:
                        for server in order:
                            run = measure(pair, server, case, body, ctype, engine, seconds, warmup)
                            runs[(case.name, engine, server)].append(run)
                            lat = run.result.latency
                            print(
                                f"  run {r + 1} {engine:<5} {server:<10} {run.result.throughput_rps:9.1f} req/s  "
                                f"p50 {lat.p50_ms if lat else float('nan'):7.2f} ms  "
                                f"p99 {lat.p99_ms if lat else float('nan'):7.2f} ms  "
                                f"client CPU {run.result.client.cpu_percent:3.0f}%  "
                                f"others {run.others_cores:4.2f} cores",
                                flush=True,
                            )
    report(runs, cases, engines, seconds)


if __name__ == "__main__":
    main()
