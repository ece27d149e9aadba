"""The default config, untuned, against TorchServe's default, on resnet18 in one run: what thread-awareness is
worth before any tuning.

    python benchmarks/tune_default_threads.py [--seconds 10] [--repeats 3] [--workers 1,2] [--quick]

Both servers load the same resnet18.mar (TorchServe's torch-model-archiver, the shared image-classifier handler),
with the same workers, batch 1 and delay 100 ms (both servers' defaults), under the same closed-loop load
(``--concurrency``, default 8). They differ in threads only, each as it is out of the box:

- **TorchServe's default**: it does not set a worker's thread count; every worker takes torch's default, as many
  intra-op threads as the host has physical cores, whatever the number of workers (set here as OMP_NUM_THREADS
  = torch's own default, which is what the launcher of benchmarks/vs_torchserve.py, reused here, needs);
- **servetune's default** (``numThreads`` 0): each worker gets an even share of the physical cores among all the
  host's workers (at least 1), told again when workers are added or removed;
- **servetune with TorchServe's threads** (``threads_per_worker`` = physical cores), to show that the difference is
  the threads, not the server.

Workers default to the host's logical CPUs on TorchServe (``default_workers_per_model``), so 2 here; 1 is measured
too. Runs alternate between the servers (A B, B A, ...), so drift in the machine's load hits both; figures are
medians over the repeats, ratios servetune / TorchServe of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import signal
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vs_torchserve as vs  # noqa: E402  (its TorchServe launcher, archives, pair and measure)


def median(runs: list[vs.Run]) -> tuple[float, float, float]:
    """Median req/s, P50 and P99 of a server's runs."""
    lats = [r.result.latency for r in runs if r.result.latency is not None]
    return (
        statistics.median(r.result.throughput_rps for r in runs),
        statistics.median(lat.p50_ms for lat in lats) if lats else 0.0,
        statistics.median(lat.p99_ms for lat in lats) if lats else 0.0,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per run (default 10; quick 3)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per server and setting (default 3; quick 1)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--quick", action="store_true", help="3 s runs, 1 repeat: a smoke test of the script")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    repeats = args.repeats or (1 if args.quick else 3)
    warmup = 1.0 if args.quick else 2.0
    if shutil.which("java") is None or shutil.which("torchserve") is None:
        raise SystemExit("needs java (openjdk-17-jre-headless) and torchserve==0.12.0 on PATH")
    default = torch.get_num_threads()  # torch's default intra-op threads: the host's physical cores
    print(f"{os.cpu_count()} CPUs, torch's default {default} intra-op threads; {seconds:g} s runs x{repeats}, "
          f"concurrency {args.concurrency}", flush=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="default-threads-") as tmp:
        store = Path(tmp) / "store"
        vs.build_archives(store, Path(tmp))
        image = vs.sample_image(Path(tmp) / "sample.png")
        for workers in (int(w) for w in args.workers.split(",")):
            base = vs.Case(f"resnet18-w{workers}", "resnet18", args.concurrency, workers, 1, 100, default)
            for label, threads in (("servetune default (even share)", 0), ("servetune, TorchServe's threads", default)):
                runs: dict[str, list[vs.Run]] = {server: [] for server in vs.SERVERS}
                st = vs.servetune(store, dataclasses.replace(base, threads=threads))
                ts = vs.TorchServe(store, base)
                with contextlib.ExitStack() as stack:
                    stack.callback(st.stop)
                    stack.callback(ts.stop)
                    with ThreadPoolExecutor(max_workers=2) as pool:
                        for future in [pool.submit(st.start), pool.submit(ts.start)]:
                            future.result()
                    pair = vs.Pair(st, ts)
                    for r in range(repeats):
                        for server in vs.SERVERS if r % 2 == 0 else vs.SERVERS[::-1]:
                            run = vs.measure(pair, server, base, image, "image/png", "async", seconds, warmup)
                            runs[server].append(run)
                            lat = run.result.latency
                            p50, p99 = (lat.p50_ms, lat.p99_ms) if lat else (0.0, 0.0)
                            print(f"  w{workers} {label:<32} run {r + 1} {server:<10} {run.result.throughput_rps:6.1f} "
                                  f"req/s  P50 {p50:7.1f}  P99 {p99:7.1f} ms  others {run.others_cores:.2f} cores",
                                  flush=True)  # fmt: skip
                rows.append((workers, label, runs))
    print("\nmedians; ratio = servetune / TorchServe's default of the medians (req/s); others: CPU of other processes")
    print("| workers | servetune | servetune req/s | P50 / P99 ms | TorchServe default req/s | P50 / P99 ms | ratio |")
    print("|---|---|---|---|---|---|---|")
    for workers, label, runs in rows:
        st, ts = (median(runs[server]) for server in vs.SERVERS)
        print(f"| {workers} | {label} | {st[0]:.1f} | {st[1]:.0f} / {st[2]:.0f} | {ts[0]:.1f} | {ts[1]:.0f} / "
              f"{ts[2]:.0f} | {st[0] / ts[0]:.2f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
