"""How much does this machine's own speed move between runs? The floor under any "within +-3% across runs" target.

A fixed CPU workload, with no server, no sockets and no load client: ResNet-18 (random weights, seed 0) forward on
one 224x224 image, one thread per process, ``--procs`` processes at once (1: one core busy; 2: both cores of a
2-core machine, as two workers are). It runs ``--windows`` windows of ``--seconds`` each, ``--every`` seconds
apart (idle in between, as a tuning study's load runs are spaced by server changes), and records per window the
images per second of all processes together and the CPU that other processes on the machine used meanwhile
(``servetune.bench.host``: a window where they used >= 0.25 of a core is *contended*).

    python benchmarks/host_drift.py [--procs 1] [--windows 12] [--seconds 5] [--every 20] [--json FILE]

Prints each window, then over the windows measured in peace: the mean, the largest deviation from it (the figure to
hold against a +-3% target), max/min, and the coefficient of variation. A tuner cannot measure one config more
steadily than this machine runs a fixed loop: where this spread is wider than a target, the target is not reachable
here by measuring the server better, only by measuring longer or elsewhere.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from servetune.bench.host import HostSampler  # noqa: E402


def worker(start: Any, stop: Any, counts: Any) -> None:
    """Count forwards while ``start`` is set; add them to this process's slot of ``counts``; end on ``stop``."""
    import torch
    import torchvision

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    image = torch.rand(1, 3, 224, 224)
    index = int(mp.current_process().name.rsplit("-", 1)[-1])
    with torch.inference_mode():
        model(image)  # warm
        while True:
            start.wait()
            if stop.is_set():
                return
            done = 0
            while start.is_set():
                model(image)
                done += 1
            counts[index] += done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    ctx = mp.get_context("spawn")
    start, stop = ctx.Event(), ctx.Event()
    counts = ctx.Array("l", args.procs)
    procs = [ctx.Process(target=worker, args=(start, stop, counts), name=f"drift-{i}") for i in range(args.procs)]
    for p in procs:
        p.start()
    time.sleep(8)  # imports and the warm-up forward
    rows = []
    print(f"ResNet-18, 1 thread each, {args.procs} process(es), {args.seconds:g} s windows {args.every:g} s apart")
    for w in range(args.windows):
        began = time.monotonic()
        before = sum(counts[:])
        sampler = HostSampler(server_pids=[p.pid for p in procs if p.pid])
        sampler.start()
        t0 = time.perf_counter()
        start.set()
        time.sleep(args.seconds)
        start.clear()
        time.sleep(0.5)  # each process finishes its image and adds its count
        wall = time.perf_counter() - t0 - 0.5
        usage = sampler.stop()
        rate = (sum(counts[:]) - before) / wall
        others = usage.others_cores if usage else float("nan")
        steal = usage.steal_cores if usage and usage.steal_cores is not None else float("nan")
        contended = bool(usage and usage.contended)
        rows.append({"window": w, "images_per_s": round(rate, 2), "others_cores": others, "steal_cores": steal,
                     "contended": contended})  # fmt: skip
        mark = "  (contended)" if contended else ""
        print(f"window {w:2d}: {rate:7.2f} img/s   others {others:.2f} cores, steal {steal:.2f}{mark}")
        time.sleep(max(0.0, args.every - (time.monotonic() - began)))
    stop.set()
    start.set()
    for p in procs:
        p.join(10)

    clean = [r["images_per_s"] for r in rows if not r["contended"]]
    summary: dict[str, object] = {"windows": len(rows), "clean": len(clean)}
    if len(clean) >= 2:
        mean = statistics.fmean(clean)
        summary |= {
            "mean": round(mean, 2),
            "max_deviation": round(max(abs(x - mean) for x in clean) / mean, 4),
            "max_over_min": round(max(clean) / min(clean), 3),
            "cv": round(statistics.stdev(clean) / mean, 4),
        }
        print(f"in peace ({len(clean)} of {len(rows)} windows): mean {mean:.2f} img/s, largest deviation "
              f"+-{100 * summary['max_deviation']:.1f}% (max/min {summary['max_over_min']}, "
              f"CV {100 * summary['cv']:.1f}%)")  # fmt: skip
    else:
        print(f"only {len(clean)} of {len(rows)} windows in peace: no figure")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows, **summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
