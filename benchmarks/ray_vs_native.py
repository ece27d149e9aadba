"""ResNet-18 on CPU through the Ray backend and through servetune's own server, same workers and batch settings.

Both servers get the same archive (examples/resnet18, random weights), the same workers (Ray: replicas), threads per
worker, batch size and batch delay, and the same closed-loop load from servetune.bench. The Ray side starts a local
Ray instance inside its driver (``--ray-address local``) unless ``--ray-address`` names a running cluster.

    python benchmarks/ray_vs_native.py [--workers 2] [--batch 4] [--delay 50] [--seconds 20] [--repeats 2]

Prints each run's throughput and P50/P99 latency for both backends and the Ray/native ratios (Ray's HTTP proxy
costs throughput; this measures how much on this machine). Runs alternate native, Ray, native, Ray, ... so that
drift in the machine's load hits both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "resnet18"))

from make_archive import build, sample_image  # noqa: E402

from servetune.bench import BenchResult, BenchSpec, run_bench  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402


def properties(workers: int, batch: int, delay_ms: int, threads: int) -> dict[str, str]:
    models = '{"resnet18": {"1.0": {"minWorkers": %d, "maxWorkers": %d, "batchSize": %d, "maxBatchDelay": %d}}}'
    return {
        "disable_token_authorization": "true",
        "threads_per_worker": str(threads),
        "default_workers_per_model": str(workers),
        "models": models % (workers, workers, batch, delay_ms),
    }


def measure(server: EmbeddedServer, image: Path, seconds: float, concurrency: int) -> BenchResult:
    spec = BenchSpec(
        url=f"{server.inference_url}/predictions/resnet18",
        input=image,
        content_type="image/png",
        concurrency=concurrency,
        duration=seconds,
        warmup_seconds=3.0,
        management_url=server.management_url,
    )
    result = run_bench(spec)
    if result.failed:
        raise SystemExit(f"{type(server).__name__}: {result.failed} failed requests: {result.errors}")
    return result


def p99(result: BenchResult) -> float:
    assert result.latency is not None
    return result.latency.p99_ms


def line(label: str, result: BenchResult) -> str:
    assert result.latency is not None
    lat = result.latency
    return (
        f"{label:<7} {result.throughput_rps:8.2f} req/s   p50 {lat.p50_ms:8.1f} ms   p99 {lat.p99_ms:8.1f} ms"
        f"   ({result.succeeded} requests, workers={result.labels.get('workers')}, "
        f"batch={result.labels.get('batch_size')})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--delay", type=int, default=50, help="max batch delay, ms")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ray-address", default="local", help="'local': a Ray instance inside the driver")
    args = parser.parse_args()
    concurrency = 2 * args.workers * args.batch
    props = properties(args.workers, args.batch, args.delay, args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        build(store)
        image = sample_image(Path(tmp) / "sample.png")
        models = {"resnet18": "resnet18.mar"}
        backends: dict[str, Callable[[], EmbeddedServer]] = {
            "native": lambda: EmbeddedServer(store, models, props),
            "ray": lambda: EmbeddedServer(store, models, props, backend="ray", ray_address=args.ray_address),
        }
        results: dict[str, list[BenchResult]] = {"native": [], "ray": []}
        for r in range(args.repeats):
            for name, make in backends.items():
                with make() as server:
                    result = measure(server, image, args.seconds, concurrency)
                results[name].append(result)
                print(f"run {r + 1}: {line(name, result)}", flush=True)

    def median(name: str, key: Callable[[BenchResult], float]) -> float:
        return statistics.median(key(r) for r in results[name])

    native_rps, ray_rps = (median(n, lambda r: r.throughput_rps) for n in ("native", "ray"))
    native_p99, ray_p99 = (median(n, p99) for n in ("native", "ray"))
    print(
        f"\nresnet18, CPU, {args.workers} workers x {args.threads} thread(s), batch {args.batch}, "
        f"delay {args.delay} ms, concurrency {concurrency}, {args.seconds:g} s x {args.repeats} runs (medians):"
    )
    print(f"  native {native_rps:8.2f} req/s   p99 {native_p99:8.1f} ms")
    print(f"  ray    {ray_rps:8.2f} req/s   p99 {ray_p99:8.1f} ms")
    print(f"  ray/native: throughput {ray_rps / native_rps:.3f}, p99 {ray_p99 / native_p99:.3f}")


if __name__ == "__main__":
    main()
