"""The controller's threads knob on ResNet-18: an SLA that one intra-op thread per worker cannot meet and two can.

    python benchmarks/controller_threads.py [--rounds 2] [--seconds 40] [--sla-x 1.4] [--json FILE]

ResNet-18 on the CPU (random weights, seed 0) behind the built-in image_classifier, as
benchmarks/controller_vs_baselines.py serves it. First its batch-1 time at one thread, t1 (one worker, one thread,
a closed loop of one, the server's own handler time, median). The SLA is ``--sla-x`` times t1 (default 1.4): at
one thread a lone request may wait for one ahead of it (2·t1), or with two one-thread workers for half of one
(1.5·t1), both past the SLA, so no batch size, delay or worker count holds it; at two threads 2·t2 fits when two
threads run a batch at least 1.43× faster. Then one seeded open-loop trace (Poisson: the first half at 0.25 / t1,
the second at 0.6 / t1) against each deployment of the same archive, interleaved over ``--rounds`` (the order
turned each round):

- ``1x1``, ``2x1``, ``1x2``: workers × threads fixed (no controller, batch size 1);
- ``controller``: servetune's controller with the SLA, ``bounds.threads: [1, 2]``, ``workers: [1, cores]``,
  ``batch_size: [1, 8]``, shedding on, registered at one worker × one thread: nothing set by hand but the SLA and
  the bounds.

Per deployment: attainment (answers inside the SLA over all requests sent; a 503 is a miss), P99 (from each
request's intended send), CPU-seconds of all the server's processes per 1,000 good answers, and for the
controller its knobs at the end; medians over the rounds. Measure alone, one benchmark at a time:
``flock /tmp/servetune-bench.lock python benchmarks/controller_threads.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from controller_vs_baselines import Served, build_archive, call, resnet18  # noqa: E402
from serve_overhead import tree_cpu_s  # noqa: E402

from servetune.bench import BenchSpec, run_bench  # noqa: E402
from servetune.bench.schedule import Schedule  # noqa: E402
from servetune.bench.shapes import Segment, shape  # noqa: E402
from servetune.bench.slo import Slo  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402
from servetune.hardware import physical_cores  # noqa: E402

DEPLOYMENTS = ("1x1", "2x1", "1x2", "controller")


def server_cpu_s(server: EmbeddedServer) -> float:
    assert server.proc is not None
    return tree_cpu_s(server.proc.pid)


class Runner:
    def __init__(self, server: EmbeddedServer, store: Path, served: Served) -> None:
        self.server, self.store, self.served = server, store, served
        self.count = 0

    def register(self, config: dict[str, Any], section: dict[str, Any], workers: int) -> str:
        self.count += 1
        name = f"m{self.count}"
        archive = build_archive(self.store, replace(self.served, config=config), name, section)
        query = urllib.parse.urlencode({"url": archive, "initial_workers": workers, "synchronous": "true"})
        status, body = call(f"{self.server.management_url}/models?{query}", "POST")
        if status != 200:
            raise RuntimeError(f"registering {name}: {status} {body}")
        url = f"{self.server.inference_url}/predictions/{name}"  # every worker past its first, slow passes
        run_bench(BenchSpec(url=url, input=self.served.body, concurrency=workers, requests=8 * workers))
        return name

    def batch1_ms(self) -> float:
        name = self.register({**self.served.config, "batchSize": 1}, {}, 1)
        try:
            spec = BenchSpec(url=f"{self.server.inference_url}/predictions/{name}", input=self.served.body,
                             concurrency=1, duration=6.0, warmup_seconds=1.0)  # fmt: skip
            rec = run_bench(spec).samples
        finally:
            call(f"{self.server.management_url}/models/{name}", "DELETE")
        assert rec is not None
        handler = np.frombuffer(rec.handler_ms, dtype=np.float64)
        return float(np.median(handler[np.isfinite(handler)]))

    def run(self, deployment: str, schedule: Schedule, sla_ms: float, cores: int) -> dict[str, Any]:
        config = {**self.served.config, "batchSize": 1, "maxBatchDelay": 0}
        section: dict[str, Any] = {}
        if deployment == "controller":
            workers = 1
            section = {
                "slo": {"p99_ms": sla_ms},
                "bounds": {
                    "batch_size": [1, 8],
                    "max_batch_delay_ms": [0, 0],
                    "workers": [1, cores],
                    "threads": [1, 2],
                },  # fmt: skip
                "shed": True,
            }
        else:
            workers, threads = (int(x) for x in deployment.split("x"))
            config["numThreads"] = threads
        name = self.register(config, section, workers)
        try:
            cpu0 = server_cpu_s(self.server)
            spec = BenchSpec(url=f"{self.server.inference_url}/predictions/{name}", input=self.served.body,
                             schedule=schedule, slo=Slo(p99_ms=sla_ms), window_s=10.0, timeout=30.0)  # fmt: skip
            result = run_bench(spec)
            cpu = server_cpu_s(self.server) - cpu0
            status, described = call(f"{self.server.management_url}/models/{name}", "GET")
        finally:
            call(f"{self.server.management_url}/models/{name}", "DELETE")
        assert result.slo is not None and result.samples is not None
        rec = result.samples
        latency = np.frombuffer(rec.latency_ms, dtype=np.float64)
        codes = np.frombuffer(rec.status, dtype=np.int32)
        good = int(((codes >= 200) & (codes < 300) & (latency <= sla_ms)).sum())
        controller = described[0].get("controller", {}) if status == 200 else {}
        return {
            "deployment": deployment,
            "attainment": result.slo.attainment,
            "p99_ms": result.latency.p99_ms if result.latency else math.nan,
            "cpu_s_per_1000": 1000.0 * cpu / max(1, good),
            "shed": int(controller.get("shed", 0)),
            "knobs": controller.get("knobs"),
            "knob_changes": int(controller.get("knobChanges", 0)),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=40.0, help="the trace's length")
    parser.add_argument("--sla-x", type=float, default=1.4, help="the SLA, times the batch-1 time at 1 thread")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cores = physical_cores()
    if cores < 2:
        sys.exit(f"{cores} physical core(s): two threads need two")
    started = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", flush=True)

    log(f"loadavg before: {open('/proc/loadavg').read().split()[:3]}; {os.cpu_count()} CPUs, {cores} physical cores")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="controller-threads-") as tmp:
        store = Path(tmp) / "store"
        store.mkdir()
        served = resnet18(Path(tmp))
        properties = {"disable_token_authorization": "true", "enable_model_api": "true"}
        with EmbeddedServer(store, {}, properties, workdir=Path(tmp) / "server") as server:
            runner = Runner(server, store, served)
            t1 = runner.batch1_ms()
            sla = round(args.sla_x * t1, 1)
            low, high = 0.25 * 1000.0 / t1, 0.6 * 1000.0 / t1
            half = args.seconds / 2
            schedule = shape([Segment(half, low), Segment(half, high)], process="poisson", seed=args.seed)
            log(f"batch of one at 1 thread: {t1:.1f} ms; SLA P99 {sla:g} ms ({args.sla_x:g}x); trace {low:.1f} -> "
                f"{high:.1f} req/s, {len(schedule)} requests in {args.seconds:g} s")  # fmt: skip
            for r in range(args.rounds):
                order = DEPLOYMENTS[r % len(DEPLOYMENTS) :] + DEPLOYMENTS[: r % len(DEPLOYMENTS)]
                for deployment in order:
                    row = runner.run(deployment, schedule, sla, cores)
                    row["round"] = r + 1
                    rows.append(row)
                    knobs = f", knobs {row['knobs']} ({row['knob_changes']} changes)" if row["knobs"] else ""
                    log(f"round {r + 1} {deployment:>10}: attainment {100 * row['attainment']:6.2f}%, P99 "
                        f"{row['p99_ms']:7.1f} ms, {row['cpu_s_per_1000']:6.2f} CPU-s/1000 good, shed {row['shed']}"
                        f"{knobs}")  # fmt: skip
    print()
    print(f"ResNet-18, batch 1 at 1 thread {t1:.1f} ms, SLA P99 {sla:g} ms; medians of {args.rounds} rounds")
    print(f"{'deployment':>10} {'attainment %':>13} {'P99 ms':>8} {'CPU-s/1000 good':>16}")
    for deployment in DEPLOYMENTS:
        mine = [row for row in rows if row["deployment"] == deployment]
        print(f"{deployment:>10} {100 * statistics.median(r['attainment'] for r in mine):13.2f} "
              f"{statistics.median(r['p99_ms'] for r in mine):8.1f} "
              f"{statistics.median(r['cpu_s_per_1000'] for r in mine):16.2f}")  # fmt: skip
    log(f"done; loadavg after: {open('/proc/loadavg').read().split()[:3]}")
    if args.json is not None:
        args.json.write_text(json.dumps({"t1_ms": t1, "sla_ms": sla, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
