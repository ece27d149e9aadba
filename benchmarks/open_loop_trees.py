"""Open-loop latency near capacity, servetune against servetune: an interleaved A/B of two source trees on a model
with two workers and dynamic batching (what the batcher's dispatch decides: who takes which requests, when).

    python benchmarks/open_loop_trees.py --tree base=/tmp/base/src --tree new=src [--model cost|resnet18]
        [--pairs 4] [--seconds 20] [--rate R | --burst N --period S] [--json FILE]

``--model cost`` (default): a known-cost handler whose batch of n sleeps 10 + 35·n ms (resnet18's cost on one core
here, without its CPU: the dispatch alone decides the latency); ``--model resnet18``: ResNet-18 on the CPU (random
weights, seed 0) behind the built-in image_classifier, a 320×240 PNG per request. Both: 2 workers × 1 thread, batch
size 8, batch delay 10 ms (vs_peers.py's setup). Each tree runs its own server (``PYTHONPATH`` at the tree), all up
for the whole run; each pair sends the same seeded Poisson schedule at ``--rate`` to each tree in turn (the order
alternates pair by pair), timed from each request's intended send. The rate defaults to 80% of the first tree's
closed-loop throughput at 16 connections (vs_peers.py's ``resnet18-open``). ``--burst N --period S`` sends instead
N requests at once every S seconds (a client that fans out a batch of requests; the workers idle in between).
Prints per run P50/P99 and the other
processes' CPU; at the end, per tree, the medians, and each other tree's P50 and P99 over the first's as mean,
median and tail of the pairs' ratios with a verdict (``servetune.bench.repeats``: "no verdict" when pairs disagree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from servetune.archive import create_archive
from servetune.bench import BenchSpec, run_bench
from servetune.bench.repeats import spread, verdict
from servetune.bench.schedule import Schedule, from_times
from servetune.control import Cost
from servetune.embedded import EmbeddedServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from controller_vs_baselines import known_cost, resnet18  # noqa: E402

CONFIG = {"batchSize": 8, "maxBatchDelay": 10, "minWorkers": 2, "maxWorkers": 2, "numThreads": 1}


def build(tmp: Path, model: str) -> Path:
    """The archive in ``tmp/store`` as ``m.mar`` (controller_vs_baselines.py's models, with this setup's batching and
    workers); returns the request body."""
    served = known_cost(tmp, Cost(10.0, 35.0)) if model == "cost" else resnet18(tmp)
    (tmp / "store").mkdir()
    (tmp / "model-config.yaml").write_text(yaml.safe_dump({**served.config, **CONFIG}))
    create_archive(model_name="m", version="1.0", config_file=str(tmp / "model-config.yaml"),
                   export_path=str(tmp / "store"), **served.files)  # fmt: skip
    return served.body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a src directory (repeat)")
    parser.add_argument("--model", choices=("cost", "resnet18"), default="cost")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=None, help="req/s (default: 80%% of the first tree's c=16)")
    parser.add_argument("--burst", type=int, default=None, help="N requests at once every --period seconds")
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = [(name, str(Path(path).resolve())) for name, _, path in (t.partition("=") for t in args.tree)]
    print(f"loadavg before: {open('/proc/loadavg').read().split()[:3]}")
    with tempfile.TemporaryDirectory(prefix="open-loop-trees-") as tmp:
        body = build(Path(tmp), args.model)
        servers: dict[str, EmbeddedServer] = {}
        try:
            for name, src in trees:
                server = EmbeddedServer(Path(tmp) / "store", {"m": "m.mar"}, {"disable_token_authorization": "true"},
                                        workdir=Path(tmp) / f"server-{name}")  # fmt: skip
                server.env["PYTHONPATH"] = src
                servers[name] = server.start()
                url = f"{server.inference_url}/predictions/m"
                run_bench(BenchSpec(url=url, input=body, concurrency=2, requests=32))  # the workers' first passes
            rate = args.rate
            if args.burst is not None:
                rate = args.burst / args.period
                print(f"bursts of {args.burst} every {args.period:g} s ({rate:.1f} req/s)")
            elif rate is None:
                first = servers[trees[0][0]]
                closed = run_bench(BenchSpec(url=f"{first.inference_url}/predictions/m", input=body, concurrency=16,
                                             duration=max(5.0, args.seconds / 2)))  # fmt: skip
                rate = 0.8 * closed.throughput_rps
                print(f"rate: {rate:.1f} req/s (80% of {trees[0][0]}'s {closed.throughput_rps:.1f} req/s at c=16)")
            runs: list[dict[str, Any]] = []
            for pair in range(args.pairs):
                order = trees if pair % 2 == 0 else trees[::-1]
                schedule = Schedule.steady(rate, "poisson", seconds=args.seconds, seed=pair)
                if args.burst is not None:
                    starts = np.arange(0.0, args.seconds, args.period)
                    schedule = from_times(np.repeat(starts, args.burst), name=f"bursts of {args.burst}")
                for name, _ in order:
                    url = f"{servers[name].inference_url}/predictions/m"
                    result = run_bench(BenchSpec(url=url, input=body, schedule=schedule, timeout=60.0))
                    latency = result.latency
                    others = result.host.others_cores if result.host else float("nan")
                    run = {
                        "pair": pair,
                        "tree": name,
                        "p50_ms": latency.p50_ms if latency else float("nan"),
                        "p99_ms": latency.p99_ms if latency else float("nan"),
                        "answered": result.succeeded,
                        "errors": result.failed,
                        "others_cores": others,
                        "contended": result.contended,
                    }
                    runs.append(run)
                    print(
                        f"pair {pair + 1} {name:>8}: P50 {run['p50_ms']:7.1f} ms, P99 {run['p99_ms']:7.1f} ms, "
                        f"{result.succeeded} answered, {result.failed} errors; others {others:.2f} cores"
                        + (" (contended)" if result.contended else ""),
                        flush=True,
                    )
        finally:
            for server in servers.values():
                server.stop()
    base = trees[0][0]
    for name, _ in trees:
        mine = [r for r in runs if r["tree"] == name]
        print(f"{name}: median P50 {statistics.median(r['p50_ms'] for r in mine):.1f} ms, "
              f"median P99 {statistics.median(r['p99_ms'] for r in mine):.1f} ms")  # fmt: skip
        if name == base:
            continue
        for figure in ("p50_ms", "p99_ms"):
            pairs = [(r, b) for r in mine for b in runs if b["tree"] == base and b["pair"] == r["pair"]]
            ratios = [r[figure] / b[figure] for r, b in pairs]
            contended = [bool(r["contended"] or b["contended"]) for r, b in pairs]
            print(f"  {figure[:3].upper()} {name} / {base}: {spread(ratios, higher_is_better=False).describe(3)}; "
                  f"lower (< 1): {verdict(ratios, 1.0, higher_is_better=False, contended=contended)}")  # fmt: skip
    print(f"loadavg after: {open('/proc/loadavg').read().split()[:3]}")
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
