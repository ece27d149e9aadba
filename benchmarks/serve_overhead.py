"""Served throughput and frontend overhead against a bare PyTorch loop, measured in one run.

ResNet-18 (random weights, CPU) behind servetune's built-in image_classifier handler, against the same
preprocessing + model + postprocessing in a plain loop in this process, with the same threads and batch size.

    python benchmarks/serve_overhead.py [--batch 4] [--seconds 20]

Prints: bare loop images/s, served requests/s, their ratio (target >= 0.95 at batch 4), and at batch 1 the
per-request frontend overhead = client latency - handler time (median; target < 2 ms).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "resnet18"))

from make_archive import build, sample_image  # noqa: E402

from servetune.bench import BenchSpec, run_bench  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402
from servetune.handlers.image_classifier import ImageClassifier  # noqa: E402


def bare_loop(image_bytes: bytes, batch: int, threads: int, seconds: float) -> float:
    """Images/s of decode + transform + forward + softmax/top-5, batch at a time, no server."""
    from model import ResNet18

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = ResNet18().eval()
    handler = ImageClassifier()
    done, start = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < seconds or done < 3 * batch:
            images = [handler.image_processing(Image.open(io.BytesIO(image_bytes))) for _ in range(batch)]
            out = model(torch.stack(images))
            probs, classes = torch.topk(torch.softmax(out, dim=1), 5, dim=1)
            _ = (probs.tolist(), classes.tolist())
            done += batch
    return done / (time.perf_counter() - start)


def served(
    store: Path, image: Path, batch: int, threads: int, seconds: float, concurrency: int
) -> tuple[float, list[float]]:
    properties = {
        "disable_token_authorization": "true",
        "threads_per_worker": str(threads),
        "default_workers_per_model": "1",
        "models": json.dumps({"resnet18": {"1.0": {"batchSize": batch, "maxBatchDelay": 50}}}),
    }
    with EmbeddedServer(store, {"resnet18": "resnet18.mar"}, properties) as server:
        spec = BenchSpec(
            url=f"{server.inference_url}/predictions/resnet18",
            input=image,
            content_type="image/png",
            concurrency=concurrency,
            duration=seconds,
            warmup_seconds=3.0,
        )
        result = run_bench(spec)
        assert result.samples is not None and result.failed == 0, result.errors
        rec = result.samples
        overhead = [lat - h for lat, h in zip(rec.latency_ms, rec.handler_ms, strict=True)]
        return result.throughput_rps, overhead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        build(store)
        image = sample_image(Path(tmp) / "sample.png")
        data = image.read_bytes()
        ratios = []
        for r in range(args.repeats):
            bare = bare_loop(data, args.batch, args.threads, args.seconds)
            rps, _ = served(store, image, args.batch, args.threads, args.seconds, concurrency=2 * args.batch)
            ratios.append(rps / bare)
            print(
                f"run {r + 1}: bare loop {bare:7.2f} img/s | served {rps:7.2f} req/s | ratio {rps / bare:.3f}"
                f"  (batch {args.batch}, {args.threads} threads)",
                flush=True,
            )
        print(
            f"served/bare throughput at batch {args.batch}: median ratio {statistics.median(ratios):.3f} "
            f"over {args.repeats} runs (target >= 0.95)"
        )
        _, overhead = served(store, image, 1, args.threads, args.seconds / 2, concurrency=1)
        print(
            f"frontend overhead at batch 1 (client latency - handler time), over {len(overhead)} requests: "
            f"median {statistics.median(overhead):.2f} ms, p90 {statistics.quantiles(overhead, n=10)[-1]:.2f} ms "
            "(target: median < 2 ms)"
        )


if __name__ == "__main__":
    main()
