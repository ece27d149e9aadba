"""Does the load generator keep a trace's schedule at 2,000 req/s from one client core?

    python benchmarks/trace_fidelity.py [--seconds 30] [--peak 2000] [--out DIR] [--profile FILE]

A no-op HTTP server (bench_ceiling.py's: a raw asyncio protocol answering "OK", its own process) is driven by
``servetune bench``'s engine (``run_bench``) with two schedules:

- **step**: ``examples/traces/step-2.5x.yaml``, 800 req/s then 2,000 req/s (Poisson), a 2.5x step;
- **azure**: ``examples/traces/azure-functions-2019.csv``, the three functions summed, a day compressed into
  ``--seconds`` (time scale), its rate scaled so that its busiest second is ``--peak`` req/s; Poisson within each
  minute.

For each: requests sent, the largest deviation of one second's sends from the schedule (target: within 1%), the
schedule slip (actual minus intended send time) P50/P99/worst (target: P99 < 1 ms), the client's CPU (one core:
the engine's event loop), the machine's interference (the CPU other processes used meanwhile: a run on a busy
machine says so), and goodput, attainment and the windows against a P99 <= 50 ms SLO (a no-op answers in well under
that: every miss is the client's or the machine's). ``--out DIR`` writes each run's report (``requests.jsonl``
included); ``--profile FILE`` writes a CPU profile (cProfile, thread CPU time) of the step run.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ceiling import _wait_for, free_port  # noqa: E402

from servetune.bench import BenchResult, BenchSpec, run_bench  # noqa: E402
from servetune.bench.report import write_report  # noqa: E402
from servetune.bench.schedule import Schedule  # noqa: E402
from servetune.bench.slo import Slo  # noqa: E402
from servetune.bench.traces import read_trace  # noqa: E402

TRACES = ROOT / "examples" / "traces"


def schedules(seconds: float, peak: float) -> dict[str, Schedule]:
    step = read_trace(TRACES / "step-2.5x.yaml")
    day = read_trace(TRACES / "azure-functions-2019.csv")
    day = day.time_scaled(seconds / day.duration_s)
    azure = day.rate_scaled(peak / day.peak_rps(1.0), seed=1)
    return {"step": step.head(seconds=seconds), "azure": azure}


def show(name: str, result: BenchResult) -> None:
    f, host, slo = result.fidelity, result.host, result.slo
    assert f is not None and slo is not None
    print(f"\n{name}: {result.schedule}")
    print(f"  sent {result.sent} in {result.duration_s:.1f} s ({result.sent / max(result.duration_s, 1e-9):.0f} req/s "
          f"mean), errors {result.failed}")  # fmt: skip
    ok = "met" if f.second_deviation <= 0.01 else "NOT met"
    print(f"  per-second sends: within {100 * f.second_deviation:.2f}% of the schedule over {f.seconds} s "
          f"(worst second {f.worst_second}; target 1%: {ok})")  # fmt: skip
    ok = "met" if f.slip_p99_ms < 1.0 else "NOT met"
    print(f"  slip: P50 {f.slip_p50_ms:.3f} ms, P99 {f.slip_p99_ms:.3f} ms, worst {f.slip_max_ms:.1f} ms "
          f"(target P99 < 1 ms: {ok}); late sends (> 1 ms) {result.late_sends}")  # fmt: skip
    print(f"  client CPU {result.client.cpu_percent:.0f}% of one core; machine: {host.describe() if host else 'n/a'}")
    print(f"  SLO {slo.slo.describe()}: {slo.describe()}; reliable: {not result.unreliable}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each schedule")
    parser.add_argument("--peak", type=float, default=2000.0, help="the Azure trace's busiest second, req/s")
    parser.add_argument("--out", type=Path, help="write each run's report here")
    parser.add_argument("--profile", type=Path, help="write a CPU profile of the step run here")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "bench_ceiling.py"), "--serve", str(port)])
    try:
        _wait_for(port)
        print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the start")
        with tempfile.TemporaryDirectory() as tmp:
            body = Path(tmp) / "body.txt"
            body.write_text("hello")
            for name, schedule in schedules(args.seconds, args.peak).items():
                spec = BenchSpec(url=f"http://127.0.0.1:{port}/predictions/noop", input=body, schedule=schedule,
                                 slo=Slo(p99_ms=50.0), server_pids=(server.pid,), max_connections=256)  # fmt: skip
                profiler = cProfile.Profile(time.thread_time) if args.profile and name == "step" else None
                if profiler is not None:
                    profiler.enable()
                result = run_bench(spec)
                if profiler is not None and args.profile is not None:
                    profiler.disable()
                    profiler.dump_stats(args.profile)
                show(name, result)
                if args.out is not None:
                    for path in write_report(result, args.out / name):
                        print(f"  wrote {path}")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
