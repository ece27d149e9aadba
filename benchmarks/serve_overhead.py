"""Served throughput and frontend overhead against a bare worker loop, measured in one run.

ResNet-18 (random weights, CPU) behind servetune's built-in image_classifier handler (examples/resnet18). The
baseline ("bare") is a worker without the server: a separate process started as the server starts a worker (a fresh
``python`` with OMP_NUM_THREADS and MKL_NUM_THREADS set to the worker's threads, then torch.set_num_threads), that
opens the same archive, loads it through the worker's loader (servetune.handlers.service.load_service) and calls the
same ``Service.predict`` on batches of ``--batch`` requests carrying the same PNG bytes: decode, transform, model,
top-5 and response encoding, exactly the worker's work, with the worker's malloc tuning
(``servetune.server.batch_memory``). With ``--workers N``, N such processes loop at once (the baseline of a server
with N workers: what the cores give when nothing but the workers' own work runs), and the server runs N workers
under a closed loop of 2 x batch x N clients. What the served figure adds is the frontend, the socket hop to the
workers, batching waits and the load client, on the same cores.

    python benchmarks/serve_overhead.py [--batch 4] [--threads N] [--workers 1] [--seconds 20] [--repeats 3]

One server stays up for the whole run (idle during the bare runs); runs alternate bare, served, bare, served, ...
so that drift in the machine's load hits both. Each run records how much CPU other processes on the machine used
meanwhile (a shared machine's other tenants); a pair where they used 0.25 of a core or more is *contended*.

Per batch, both sides report the mean, the median and the tail (P99) of their time per batch, and their rate both
as measured (images over wall time) and as the median batch implies: a few stalled batches (two OpenMP threads on two
shared cores) can halve the measured rate while the median batch says what the loop does when it runs. The summary
gives served/bare as mean, median and tail over the runs, and a verdict against the target (>= 0.95 at batch 4) that
is "no verdict" when the runs disagree (``servetune.bench.repeats``): contended pairs are left out when two clean
ones remain. At batch 1, the per-request frontend overhead = client latency - handler time (median over the runs'
requests; target < 2 ms), with the same verdict rule over the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "resnet18"))

from make_archive import build, sample_image  # noqa: E402

from servetune.bench import BenchResult, BenchSpec, run_bench  # noqa: E402
from servetune.bench.host import CONTENDED_CORES  # noqa: E402
from servetune.bench.repeats import spread, verdict  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402


def bare_child(spec: dict[str, object]) -> None:
    """In the child process: load the archive as a worker does, then time Service.predict on whole batches."""
    from servetune.archive import open_archive
    from servetune.handlers.service import InputParam, Request, load_service
    from servetune.server.batch_memory import BatchMemory

    threads, batch = int(str(spec["threads"])), int(str(spec["batch"]))
    torch.set_num_threads(threads)  # what the worker does at load (servetune.server.worker._load)
    BatchMemory.tuned()  # and at its start: a batch's memory kept for the next
    with tempfile.TemporaryDirectory() as tmp:
        archive = open_archive(Path(str(spec["archive"])), Path(tmp))
        service = load_service(
            model_dir=archive.model_dir,
            manifest=dict(archive.manifest.raw),
            model_name="resnet18",
            gpu_id=None,
            batch_size=batch,
            model_yaml_config=dict(archive.model_config),
        )
        data = Path(str(spec["image"])).read_bytes()

        def one_batch() -> float:
            requests = [
                Request(f"r{i}", {"content-type": "image/png"}, [InputParam("body", "image/png", data)])
                for i in range(batch)
            ]
            start = time.perf_counter()
            responses = service.predict(requests)
            elapsed = time.perf_counter() - start
            assert all(r.status == 200 for r in responses), [r.body[:200] for r in responses]
            return elapsed

        deadline = time.perf_counter() + float(str(spec["warmup"]))
        while time.perf_counter() < deadline:
            one_batch()
        times: list[float] = []
        busy, own, start = busy_cpu_s(), time.process_time(), time.perf_counter()
        while time.perf_counter() - start < float(str(spec["seconds"])) or len(times) < 3:
            times.append(one_batch())
        wall = time.perf_counter() - start
        others = (busy_cpu_s() - busy - (time.process_time() - own)) / wall
    ms = sorted(t * 1000.0 for t in times)
    figures = {
        "images_per_s": len(times) * batch / wall,
        "batch_ms": statistics.median(ms),
        "batch_mean_ms": statistics.fmean(ms),
        "batch_p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "batches": len(ms),
    }
    print(json.dumps({**figures, "others_cores": max(0.0, others)}))


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (all processes, all cores)."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def tree_cpu_s(pid: int) -> float:
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def bare_loop(
    archive: Path, image: Path, batch: int, threads: int, seconds: float, warmup: float, workers: int = 1
) -> dict[str, float]:
    """Images/s and median ms per batch of the worker's work in ``workers`` processes set up like workers, looping at
    once: images/s summed, the batch times and the others' CPU of the first (they overlap in time)."""
    spec = {"archive": str(archive), "image": str(image), "batch": batch, "threads": threads}
    spec.update({"seconds": seconds, "warmup": warmup})
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, __file__, "--bare-child", json.dumps(spec)]
    children = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(workers)
    ]
    results: list[dict[str, float]] = []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"bare loop failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    figures = dict(results[0])
    figures["images_per_s"] = sum(r["images_per_s"] for r in results)
    # the others' CPU each child saw includes its siblings: what is left beyond them
    figures["others_cores"] = max(0.0, results[0]["others_cores"] - (workers - 1) * threads)
    return figures


def start_server(store: Path, batch: int, threads: int, workers: int = 1) -> EmbeddedServer:
    properties = {
        "disable_token_authorization": "true",
        "threads_per_worker": str(threads),
        "default_workers_per_model": str(workers),
        "models": json.dumps({"resnet18": {"1.0": {"batchSize": batch, "maxBatchDelay": 50}}}),
    }
    return EmbeddedServer(store, {"resnet18": "resnet18.mar"}, properties).start()


def served(
    server: EmbeddedServer, image: Path, seconds: float, warmup: float, concurrency: int
) -> tuple[BenchResult, float]:
    """The run's result, and the CPU (cores) that processes other than the server and the client used meanwhile."""
    assert server.proc is not None
    spec = BenchSpec(
        url=f"{server.inference_url}/predictions/resnet18",
        input=image,
        content_type="image/png",
        concurrency=concurrency,
        duration=seconds,
    )
    if warmup:
        run_bench(dataclasses.replace(spec, duration=warmup))
    busy, mine, start = busy_cpu_s(), tree_cpu_s(server.proc.pid), time.perf_counter()
    result = run_bench(spec)
    wall = time.perf_counter() - start
    used = busy_cpu_s() - busy - (tree_cpu_s(server.proc.pid) - mine) - result.client.cpu_seconds
    assert result.samples is not None and result.failed == 0, result.errors
    return result, max(0.0, used) / wall


def handler_ms(result: BenchResult) -> float:
    """Median handler time per batch, as the server reported it per request (X-Servetune-Handler-Ms)."""
    return handler_stats(result)[1]


def handler_stats(result: BenchResult) -> tuple[float, float, float]:
    """(mean, median, P99) of the handler time per batch, as the server reported it (X-Servetune-Handler-Ms): each
    batch once (the requests of a batch report the same time)."""
    assert result.samples is not None
    values = sorted({round(h, 3) for h in result.samples.handler_ms if h == h})
    if not values:
        return float("nan"), float("nan"), float("nan")
    return statistics.fmean(values), statistics.median(values), values[min(len(values) - 1, int(0.99 * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds before each run")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of the worker")
    parser.add_argument("--repeats", type=int, default=3, help="bare/served pairs")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (bare: loops at once)")
    parser.add_argument("--bare-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Stop cleanly, servers and their workers too, on SIGTERM, and on SIGINT even when started in the background
    # (where the shell leaves SIGINT ignored).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.bare_child:
        bare_child(json.loads(args.bare_child))
        return

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        archive = build(store)
        image = sample_image(Path(tmp) / "sample.png")
        ratios, batch_ms, contended = [], [], []
        workers = args.workers
        server = start_server(store, args.batch, args.threads, workers)
        try:
            for r in range(args.repeats):
                bare = bare_loop(archive, image, args.batch, args.threads, args.seconds, args.warmup, workers)
                result, others = served(server, image, args.seconds, args.warmup, concurrency=2 * args.batch * workers)
                ratio = result.throughput_rps / bare["images_per_s"]
                ratios.append(ratio)
                mean, median, p99 = handler_stats(result)
                batch_ms.append((median, bare["batch_ms"]))
                busy = max(bare["others_cores"], others) >= CONTENDED_CORES
                contended.append(busy)
                print(
                    f"run {r + 1}: bare {bare['images_per_s']:7.2f} img/s measured, "
                    f"{args.batch * 1000 / bare['batch_ms']:7.2f} at its median batch "
                    f"(batch ms mean {bare['batch_mean_ms']:.1f} / median {bare['batch_ms']:.1f} / "
                    f"P99 {bare['batch_p99_ms']:.1f}, {bare['batches']:.0f} batches) | "
                    f"served {result.throughput_rps:7.2f} req/s (handler ms per batch mean {mean:.1f} / median "
                    f"{median:.1f} / P99 {p99:.1f}) | served/bare {ratio:.3f} (batch {args.batch}, {workers} x "
                    f"{args.threads} threads; other processes used {bare['others_cores']:.2f} / {others:.2f} cores"
                    f"{'; CONTENDED' if busy else ''})",
                    flush=True,
                )
        finally:
            server.stop()
        served_ms, bare_ms = statistics.median(b[0] for b in batch_ms), statistics.median(b[1] for b in batch_ms)
        print(
            f"served/bare throughput at batch {args.batch}: {spread(ratios).describe(3)}; "
            f"{sum(contended)} of {len(ratios)} pairs contended; target >= 0.95: "
            f"{verdict(ratios, 0.95, contended=contended)}"
        )
        print(
            f"handler time per batch (medians over the runs): in the server {served_ms:.1f} ms, bare {bare_ms:.1f} ms "
            f"(ratio {served_ms / bare_ms:.3f}: what sharing the cores with the frontend and client costs the worker)"
        )
        server = start_server(store, 1, args.threads)
        medians, busy_runs = [], []
        try:
            for _ in range(args.repeats):
                result, others = served(server, image, args.seconds / 2, args.warmup, concurrency=1)
                rec = result.samples
                assert rec is not None
                overhead = [lat - h for lat, h in zip(rec.latency_ms, rec.handler_ms, strict=True)]
                medians.append(statistics.median(overhead))
                busy_runs.append(others >= CONTENDED_CORES)
                p90 = f"{statistics.quantiles(overhead, n=10)[-1]:.2f} ms" if len(overhead) >= 2 else "n/a"
                print(
                    f"frontend overhead at batch 1 (client latency - handler time), over {len(overhead)} requests: "
                    f"median {medians[-1]:.2f} ms, p90 {p90} "
                    f"(others {others:.2f} cores{'; CONTENDED' if busy_runs[-1] else ''})",
                    flush=True,
                )
        finally:
            server.stop()
        per_run = spread(medians, higher_is_better=False).describe(2, " ms")
        judged = verdict(medians, 2.0, higher_is_better=False, contended=busy_runs)
        print(f"frontend overhead at batch 1, per-run medians: {per_run}; target < 2 ms: {judged}")


if __name__ == "__main__":
    main()
