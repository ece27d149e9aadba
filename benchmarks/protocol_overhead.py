"""Per-request overhead of each protocol against TorchServe REST, measured in one run on one server.

    python benchmarks/protocol_overhead.py [--requests 1000] [--rounds 3]

A no-op model (its handler returns its input), one worker, batch size 1, one request in flight: the latency is the
protocol's own cost (client, transport, server, worker round trip). Each round runs every protocol in turn; the
figure per protocol is the median over rounds of its median latency, and its ratio to TorchServe REST's. Add a
protocol: one line in PROTOCOLS (name -> engine, path on its port, input).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import textwrap
from pathlib import Path

from servetune.archive import create_archive
from servetune.bench import BenchSpec, run_bench
from servetune.embedded import EmbeddedServer

NOOP = textwrap.dedent(
    """
    servetune_envelope = "tensors"

    def handle(data, context):
        if data is None:
            return None
        return [{"y": r.inputs[0].data} if hasattr(r, "inputs") else (r.get("data") or r.get("body")) for r in data]
    """
)
V2 = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]}]}

# name -> (engine, which port: the ready file's key, path, input file name)
PROTOCOLS = {
    "TorchServe REST": ("async", "inference", "/predictions/noop", "body.bin"),
    "TorchServe gRPC": ("grpc", "grpc_inference", "/predictions/noop", "body.bin"),
    "OIP v2 gRPC": ("grpc", "grpc_inference", "/v2/models/noop/infer", "v2.json"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "noop_handler.py").write_text(NOOP)
        (root / "body.bin").write_bytes(b"x" * 16)
        (root / "v2.json").write_text(json.dumps(V2))
        (root / "store").mkdir()
        create_archive(
            model_name="noop",
            version="1.0",
            handler=str(root / "noop_handler.py"),
            export_path=str(root / "store"),
            force=True,
        )
        properties = {"default_workers_per_model": "1", "disable_token_authorization": "true"}
        with EmbeddedServer(root / "store", {"noop": "noop.mar"}, properties) as server:
            medians: dict[str, list[float]] = {name: [] for name in PROTOCOLS}
            for _ in range(args.rounds):
                for name, (engine, port, path, body) in PROTOCOLS.items():
                    base = server.urls[port].replace("grpc://", "http://")
                    spec = BenchSpec(
                        url=base + path,
                        input=root / body,
                        engine=engine,
                        concurrency=1,
                        requests=args.requests,
                        warmup_requests=100,
                    )
                    result = run_bench(spec)
                    if result.failed or result.latency is None:
                        raise SystemExit(f"{name}: {result.failed} failed: {result.errors}")
                    medians[name].append(result.latency.p50_ms)
    rest = statistics.median(medians["TorchServe REST"])
    print(f"no-op model, 1 worker, 1 in flight, {args.requests} requests x {args.rounds} rounds")
    print(f"{'protocol':<18}{'p50 ms (median of rounds)':>28}{'vs REST':>10}{'  rounds'}")
    for name, values in medians.items():
        p50 = statistics.median(values)
        print(f"{name:<18}{p50:>28.3f}{p50 / rest:>10.2f}  {', '.join(f'{v:.3f}' for v in values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
