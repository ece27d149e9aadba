"""What the online controller costs per request: its own code timed in process, and a no-op model's throughput and
frontend CPU with and without it, measured in one run on one server.

    python benchmarks/controller_overhead.py [--rate 1500] [--seconds 10] [--rounds 3]

1. **In process**: the controller's work for one request (``admit``, with shedding on and a fitted cost: the arrival
   counted, its completion predicted) and for one batch (``dispatch_by``, ``dispatched``, ``finished``: the fit's
   update, the policy's observation and the decision-log line, written to a file), timed over 200,000 requests in
   batches of one (the worst case: a batch's cost is not shared), plus a tick (the policy's decision) every 100 ms of
   that work. Target: < 50 µs per request.
2. **On a server**: two no-op models on one server, ``plain`` (no controller) and ``controlled`` (servetune's
   controller, shedding on, the decision log written); rounds alternate plain, controlled, ...: the highest
   throughput of each (closed loop, 32 connections) and, at ``--rate`` req/s open loop, the frontend's CPU-seconds
   per request. Target: the controlled model's no-op throughput within 2% of the plain one's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import yaml

from servetune.archive import create_archive
from servetune.bench import BenchSpec, run_bench
from servetune.bench.schedule import Schedule
from servetune.control import Controller, Knobs, parse_settings
from servetune.control.controller import HeldKnobs
from servetune.embedded import EmbeddedServer

NOOP = textwrap.dedent(
    """
    def handle(data, context):
        if data is None:
            return None
        return ["ok"] * len(data)
    """
)
SECTION = {"slo": {"p99_ms": 100}, "bounds": {"batch_size": [1, 32], "max_batch_delay_ms": [0, 10]}, "shed": True}


async def in_process(requests: int, log: Path) -> tuple[float, float]:
    """µs per request: (admit only, admit + its batch of one + ticks)."""
    settings = parse_settings({**SECTION, "log": str(log)})
    controller = Controller("m", "1", settings, HeldKnobs(Knobs(8, 0.0, 2), queue=3))
    for n in (1, 2, 4, 8, 3, 6):  # a fitted cost, as in steady serving
        controller.dispatched("w", n)
        controller.finished("w", n, "full", 1.0, 10.0 + n, 10.0 + n)
    await controller.tick()
    started = time.perf_counter()
    for _ in range(requests):
        controller.admit(time.monotonic(), None)
    admit_us = (time.perf_counter() - started) / requests * 1e6
    started = time.perf_counter()
    next_tick = started + 0.1
    for i in range(requests):
        now = time.monotonic()
        controller.admit(now, None)
        controller.dispatch_by(now, 1)
        predicted = controller.dispatched("w", 1)
        controller.finished("w", 1, "delay", 0.5, predicted, 11.0 + (i % 3))
        if time.perf_counter() >= next_tick:
            await controller.tick()
            next_tick += 0.1
    total_us = (time.perf_counter() - started) / requests * 1e6
    await controller.close()
    return admit_us, total_us


def archive(store: Path, name: str, controller: dict[str, object] | None) -> None:
    src = store / f".src-{name}"
    src.mkdir(parents=True)
    (src / "noop.py").write_text(NOOP)
    config: dict[str, object] = {"batchSize": 8, "maxBatchDelay": 0}
    if controller is not None:
        config["controller"] = controller
    (src / "model-config.yaml").write_text(yaml.safe_dump(config))
    create_archive(
        model_name=name,
        version="1.0",
        handler=str(src / "noop.py"),
        config_file=str(src / "model-config.yaml"),
        export_path=str(store),
        force=True,
    )


def frontend_cpu(server: EmbeddedServer) -> float:
    assert server.proc is not None
    times = psutil.Process(server.proc.pid).cpu_times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1500.0, help="open-loop rate for the CPU per request")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200_000, help="in-process requests")
    args = parser.parse_args()
    print(f"loadavg before: {open('/proc/loadavg').read().split()[:3]}")
    with tempfile.TemporaryDirectory(prefix="controller-overhead-") as tmp:
        admit_us, total_us = asyncio.run(in_process(args.requests, Path(tmp) / "log.jsonl"))
        print(f"in process: admit {admit_us:.2f} us/request; with its batch of one and ticks {total_us:.2f} us/request")
        store = Path(tmp) / "store"
        archive(store, "plain", None)
        archive(store, "controlled", {**SECTION, "log": str(Path(tmp) / "served.jsonl")})
        body = Path(tmp) / "body"
        body.write_bytes(b"x")
        properties = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
        models = {"plain": "plain.mar", "controlled": "controlled.mar"}
        figures: dict[str, dict[str, list[float]]] = {m: {"rps": [], "cpu_us": [], "p99": []} for m in models}
        with EmbeddedServer(store, models, properties, workdir=Path(tmp) / "server") as server:
            for name in models:  # warm up both
                run_bench(BenchSpec(url=f"{server.inference_url}/predictions/{name}", input=body, requests=500))
            for round_ in range(args.rounds):
                for name in models:
                    url = f"{server.inference_url}/predictions/{name}"
                    closed = run_bench(BenchSpec(url=url, input=body, concurrency=32, duration=args.seconds))
                    cpu0 = frontend_cpu(server)
                    schedule = Schedule.steady(args.rate, "poisson", seconds=args.seconds, seed=round_)
                    opened = run_bench(BenchSpec(url=url, input=body, schedule=schedule))
                    cpu = frontend_cpu(server) - cpu0
                    figures[name]["rps"].append(closed.throughput_rps)
                    figures[name]["cpu_us"].append(cpu / max(1, opened.succeeded) * 1e6)
                    figures[name]["p99"].append(opened.latency.p99_ms if opened.latency else float("nan"))
                    print(
                        f"round {round_ + 1} {name:>10}: closed loop {closed.throughput_rps:7.0f} req/s; "
                        f"{args.rate:g} req/s open loop: frontend {figures[name]['cpu_us'][-1]:6.1f} CPU-us/request, "
                        f"P99 {figures[name]['p99'][-1]:.2f} ms, {opened.succeeded} answered"
                    )
    plain, controlled = figures["plain"], figures["controlled"]
    ratio = statistics.median(controlled["rps"]) / statistics.median(plain["rps"])
    extra_us = statistics.median(controlled["cpu_us"]) - statistics.median(plain["cpu_us"])
    print(f"no-op throughput, controlled / plain (medians): {ratio:.3f} (target >= 0.98)")
    print(f"frontend CPU per request at {args.rate:g} req/s, controlled - plain (medians): {extra_us:+.1f} us")
    print(f"loadavg after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
