"""The gRPC engine's own ceiling: requests/s per client core against a trivial gRPC server, so that a gRPC
benchmark measures the server, not the load generator.

    python benchmarks/grpc_engine_ceiling.py [--seconds 5] [--concurrency 16] [--rounds 3]

A trivial gRPC server (grpc.aio, its own process) answers TorchServe's Predictions and the OIP's ModelInfer with a
fixed answer (no parsing), so the server is as cheap as a gRPC server gets. The engine runs a closed loop against
each RPC; the figure that matters is requests per second of *client CPU time* (this process's user + system time,
gRPC's own threads included), which holds even when the server, sharing the machine, limits the raw rate. The HTTP
engine's figure against the same kind of no-op server is printed by benchmarks/bench_ceiling.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servetune.bench import BenchSpec, run_bench


def serve(port: int) -> None:
    import grpc

    from servetune.protos import OIP, TORCHSERVE_INFERENCE, methods

    predictions = methods(TORCHSERVE_INFERENCE)["Predictions"].response(prediction=b"OK").SerializeToString()
    infer = methods(OIP)["ModelInfer"].response(model_name="noop").SerializeToString()

    async def answer_predictions(request: bytes, context: object) -> bytes:
        return predictions

    async def answer_infer(request: bytes, context: object) -> bytes:
        return infer

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    TORCHSERVE_INFERENCE, {"Predictions": grpc.unary_unary_rpc_method_handler(answer_predictions)}
                ),
                grpc.method_handlers_generic_handler(
                    OIP, {"ModelInfer": grpc.unary_unary_rpc_method_handler(answer_infer)}
                ),
            )
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(url: str, body: Path, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, requests per client CPU second) of one closed-loop run."""
    spec = BenchSpec(url=url, input=body, engine="grpc", concurrency=concurrency, duration=seconds)
    cpu0 = cpu_seconds()
    result = run_bench(spec)
    cpu = cpu_seconds() - cpu0
    if result.failed:
        raise SystemExit(f"{url}: {result.failed} requests failed: {result.errors}")
    return result.throughput_rps, result.sent / cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        time.sleep(2.0)
        with tempfile.TemporaryDirectory() as tmp:
            body = Path(tmp) / "v2.json"
            body.write_text(
                json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
            )
            rpcs = {
                "TorchServe Predictions": f"http://127.0.0.1:{port}/predictions/noop",
                "OIP ModelInfer": f"http://127.0.0.1:{port}/v2/models/noop/infer",
            }
            shape = f"closed loop, {args.concurrency} in flight, {args.seconds:g} s, {args.rounds} rounds"
            print(f"gRPC engine ceiling against a trivial gRPC server: {shape}")
            print(f"{'rpc':<24}{'req/s (median)':>16}{'req/s per client core (median)':>34}")
            for name, url in rpcs.items():
                runs = [measure(url, body, args.concurrency, args.seconds) for _ in range(args.rounds)]
                rate = statistics.median(r for r, _ in runs)
                per_core = statistics.median(c for _, c in runs)
                print(f"{name:<24}{rate:>16.0f}{per_core:>34.0f}")
    finally:
        child.terminate()
        child.wait(10)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
        serve(int(sys.argv[2]))
    else:
        sys.exit(main())
