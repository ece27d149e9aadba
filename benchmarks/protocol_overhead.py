"""Per-request overhead of each inference protocol, on one server, in one run: a no-op model, one worker, one client.

The same tensor (FP32) goes to the same no-op handler by each protocol; with a handler that does nothing, a request's
client latency is the protocol's whole cost (HTTP, parsing, the trip to the worker, the worker's envelope, encoding
the answer): the figure is the median latency over the measured requests. Each protocol runs
``--runs`` times, interleaved; the figure is the median of the runs' medians, and its ratio to TorchServe's own REST
API (``POST /predictions``, the tensor's raw bytes) measured in the same run.

    python benchmarks/protocol_overhead.py [--requests 1000] [--runs 3] [--sizes 16,150528]

Add a protocol: one entry in ``PROTOCOLS`` (name -> function giving the bench spec for a server and its input files);
the gRPC protocols go through ``servetune bench``'s gRPC engine (typed tensors for ModelInfer), the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from servetune.archive import create_archive
from servetune.bench import BenchSpec, run_bench
from servetune.embedded import EmbeddedServer

NOOP = textwrap.dedent(
    """
    def handle(data, context):
        return None if data is None else [0 for _ in data]
    """
)
# the same, in servetune's tensors form: v2 inputs arrive as numpy arrays (no nested lists, as the kservev2 shape needs)
NOOP_TENSORS = 'servetune_envelope = "tensors"\n' + NOOP


def build(store: Path) -> None:
    for name, source in (("noop", NOOP), ("noop_tensors", NOOP_TENSORS)):
        src = store / f".src-{name}"
        src.mkdir(parents=True)
        (src / f"{name}.py").write_text(source)
        (src / "model-config.yaml").write_text(yaml.safe_dump({"batchSize": 1, "maxBatchDelay": 0}))
        create_archive(
            model_name=name,
            version="1.0",
            handler=str(src / f"{name}.py"),
            config_file=str(src / "model-config.yaml"),
            export_path=str(store),
            force=True,
        )


def grpc_url(server: EmbeddedServer, path: str) -> str:
    """The gRPC engine names its call as a REST path on the gRPC port."""
    return server.urls["grpc_inference"].replace("grpc://", "http://") + path


# name -> (server, the tensor as .npy, as raw bytes) -> the BenchSpec fields that differ between protocols
Protocol = Callable[[EmbeddedServer, Path, Path], dict[str, object]]
PROTOCOLS: dict[str, Protocol] = {
    "torchserve-rest": lambda s, npy, raw: {
        "url": f"{s.inference_url}/predictions/noop",
        "input": raw,
        "content_type": "application/octet-stream",
    },
    "oip-rest-json": lambda s, npy, raw: {
        "url": f"{s.inference_url}/v2/models/noop/infer",
        "input": npy,
        "engine": "oip-json",
    },
    "oip-rest-binary": lambda s, npy, raw: {
        "url": f"{s.inference_url}/v2/models/noop/infer",
        "input": npy,
        "engine": "oip-binary",
    },
    "oip-rest-binary-tensors-form": lambda s, npy, raw: {
        "url": f"{s.inference_url}/v2/models/noop_tensors/infer",
        "input": npy,
        "engine": "oip-binary",
    },
    "torchserve-grpc": lambda s, npy, raw: {"url": grpc_url(s, "/predictions/noop"), "input": raw, "engine": "grpc"},
    "oip-grpc-tensors-form": lambda s, npy, raw: {
        "url": grpc_url(s, "/v2/models/noop_tensors/infer"),
        "input": npy.with_suffix(".json"),
        "engine": "grpc",
    },
}
BASELINE = "torchserve-rest"


def overhead_ms(spec: BenchSpec) -> float:
    result = run_bench(spec)
    if result.failed or result.latency is None:
        raise SystemExit(f"{spec.url} ({spec.engine}): {result.failed} failed: {result.errors}")
    return result.latency.p50_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="measured requests per protocol and run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="16,150528", help="tensor sizes in FP32 elements (150528 = 3x224x224)")
    parser.add_argument("--only", default="", help="comma-separated protocol names (default: all)")
    args = parser.parse_args()
    names = [n for n in PROTOCOLS if not args.only or n in args.only.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        build(store)
        properties = {
            "disable_token_authorization": "true",
            "default_workers_per_model": "1",
            "max_request_size": str(64 << 20),
        }
        models = {"noop": "noop.mar", "noop_tensors": "noop_tensors.mar"}
        with EmbeddedServer(store, models, properties, workdir=Path(tmp) / "server") as server:
            for size in sizes:
                tensor = np.random.default_rng(0).standard_normal(size).astype(np.float32)
                npy, raw = Path(tmp) / f"x{size}.npy", Path(tmp) / f"x{size}.bin"
                np.save(npy, tensor)
                raw.write_bytes(tensor.tobytes())
                v2 = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [size], "data": tensor.tolist()}]}
                npy.with_suffix(".json").write_text(json.dumps(v2))
                figures: dict[str, list[float]] = {n: [] for n in names}
                for run in range(args.runs):
                    for name in names:
                        fields = PROTOCOLS[name](server, npy, raw)
                        spec = BenchSpec(concurrency=1, requests=args.requests, warmup_requests=50, **fields)  # type: ignore[arg-type]
                        figures[name].append(overhead_ms(spec))
                    print(
                        f"  size {size}, run {run + 1}: " + ", ".join(f"{n} {figures[n][-1]:.3f} ms" for n in names),
                        file=sys.stderr,
                        flush=True,
                    )
                base = statistics.median(figures[BASELINE]) if BASELINE in figures else None
                print(
                    f"\nFP32 tensor of {size} elements ({size * 4} bytes), {args.runs} runs of {args.requests} "
                    "requests, median client latency (no-op handler, 1 client, 1 worker):"
                )
                for name in names:
                    median = statistics.median(figures[name])
                    ratio = f"{median / base:6.2f}x {BASELINE}" if base else ""
                    runs = " ".join(f"{v:.3f}" for v in figures[name])
                    print(f"  {name:28s} {median:8.3f} ms  {ratio}   (runs: {runs})")


if __name__ == "__main__":
    main()
