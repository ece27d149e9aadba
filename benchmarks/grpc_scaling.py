"""Scaling beside busy gRPC servers: scale a model up and down through TorchServe's gRPC management API while
TorchServe's gRPC inference API serves requests, and count what broke.

    python benchmarks/grpc_scaling.py [--cycles 200] [--clients 4] [--worker-preload auto|model|imports|off]
    PYTHONPATH=/path/to/other/src python benchmarks/grpc_scaling.py     # the same loop on another checkout

Each cycle is ``ScaleWorker(min_worker=2, synchronous)`` (a worker starts) then ``ScaleWorker(min_worker=1,
synchronous)`` (one retires), with clients calling ``Predictions`` and ``DescribeModel``/``ListModels`` all along.
Prints the scale-ups that failed (a worker that crashed while it started: "exited while loading (exit code -11)"),
the inference calls that failed, and every server log line that reports an error. The exit code is 0 only when all
three are 0. ``--worker-preload off`` spawns every worker (a new interpreter per scale-up, the path that crashed in
gRPC's fork handlers); the default forks the model's workers from its parent process when the model qualifies.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from grpc_models import generate_stubs  # noqa: E402
from models import sleep_archive  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402

# What a server log line looks like when something broke (an ERROR record, a traceback, gRPC's fork warning).
BROKEN = re.compile(r"\[ERROR\]|Traceback|Future exception|fork_posix|exited while loading|Segmentation", re.I)


def run(cycles: int, clients: int, workdir: Path, preload: str) -> dict[str, Any]:
    stubs = generate_stubs(workdir / "stubs")
    store = workdir / "store"
    sleep_archive(store, "noop", batch_ms=1.0)
    properties = {"default_workers_per_model": "1", "disable_token_authorization": "true", "worker_preload": preload}
    with EmbeddedServer(store, {"noop": "noop.mar"}, properties, workdir=workdir / "server") as server:
        inference = grpc.insecure_channel(server.grpc_inference_target)
        management = grpc.insecure_channel(server.grpc_management_target)
        infer = stubs["inference_pb2_grpc"].InferenceAPIsServiceStub(inference)
        manage = stubs["management_pb2_grpc"].ManagementAPIsServiceStub(management)
        pb_i, pb_m = stubs["inference_pb2"], stubs["management_pb2"]
        stop = threading.Event()
        calls: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()

        def count(key: str) -> None:
            with lock:
                calls[key] += 1

        def predictor() -> None:
            request = pb_i.PredictionsRequest(model_name="noop", input={"data": b"ok"})
            while not stop.is_set():
                try:
                    infer.Predictions(request, timeout=60)
                    count("predict ok")
                except grpc.RpcError as exc:
                    count(f"predict {exc.code().name}: {exc.details()[:120]}")

        def describer() -> None:
            while not stop.is_set():
                try:
                    manage.DescribeModel(pb_m.DescribeModelRequest(model_name="noop"), timeout=60)
                    manage.ListModels(pb_m.ListModelsRequest(), timeout=60)
                    count("describe ok")
                except grpc.RpcError as exc:
                    count(f"describe {exc.code().name}: {exc.details()[:120]}")

        threads = [threading.Thread(target=predictor, daemon=True) for _ in range(clients)]
        threads.append(threading.Thread(target=describer, daemon=True))
        for thread in threads:
            thread.start()
        failures: collections.Counter[str] = collections.Counter()
        started = time.monotonic()
        for cycle in range(cycles):
            for workers in (2, 1):
                request = pb_m.ScaleWorkerRequest(model_name="noop", min_worker=workers, synchronous=True)
                try:
                    manage.ScaleWorker(request, timeout=300)
                except grpc.RpcError as exc:
                    failures[f"scale to {workers} {exc.code().name}: {exc.details()[:160]}"] += 1
            if (cycle + 1) % 20 == 0:
                print(f"  {cycle + 1} cycles, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        stop.set()
        for thread in threads:
            thread.join(60)
        inference.close()
        management.close()
        elapsed = time.monotonic() - started
        server.stop()
        broken = [line for line in server.output if BROKEN.search(line)]
    predict_errors = {k: v for k, v in calls.items() if not k.endswith(" ok")}
    return {
        "cycles": cycles,
        "seconds": round(elapsed, 1),
        "scale_failures": sum(failures.values()),
        "scale_failure_kinds": dict(failures),
        "calls": dict(calls),
        "call_errors": sum(predict_errors.values()),
        "log_errors": len(broken),
        "log_error_lines": broken[:20],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200, help="scale-ups (each followed by a scale-down)")
    parser.add_argument("--clients", type=int, default=4, help="threads calling Predictions all along")
    parser.add_argument("--worker-preload", default="auto", help="worker_preload (off: spawn every worker)")
    args = parser.parse_args()
    import servetune

    with open("/proc/loadavg") as fh:
        load = fh.read().strip()
    where = Path(servetune.__file__).parent
    print(f"servetune from {where}; worker_preload={args.worker_preload}; load average before: {load}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="grpc-scaling-") as tmp:
        result = run(args.cycles, args.clients, Path(tmp), args.worker_preload)
    for key, value in result.items():
        if key == "log_error_lines":
            for line in value:
                print(f"  log: {line}")
        else:
            print(f"{key}: {value}")
    ok = result["scale_failures"] == 0 and result["call_errors"] == 0 and result["log_errors"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
