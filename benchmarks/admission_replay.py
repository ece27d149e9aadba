"""Admission rules replayed offline on a recorded run: how many answers each rule would have had in time.

    python benchmarks/controller_vs_baselines.py --model resnet18 --sla-x 4 --policies controller \\
        --scores moving --decisions DIR
    python benchmarks/admission_replay.py DIR/m3-controller --sla-ms 195 [--workers 2] [--seeds 5]
        [--pred-ms 61.9 --margin-ms 20] [--overload 1.5]

Takes a run's requests (``<run>.npz``: each request's send time) and its batches of one (``<run>.jsonl``: each
batch's measured time), and replays the same arrivals on ``--workers`` workers serving one request at a time in
arrival order, each request's time drawn from the measured batch times (``--seeds`` draws). Each rule decides at a
request's arrival, as ``Controller.admit`` does: the request is refused when the completion ``law.completion_ms``
predicts (the queue ahead, the running batches' predicted time left) plus the rule's margin and ``law.SLACK_MS``
passes the SLA; an idle model (a worker free, nothing queued) refuses nothing. A rule predicts each batch to take the
measured mean (or ``--pred-ms``: a biased fit) and adds a margin of 0, 1 or 2 standard deviations of the measured
batch times (or ``--margin-ms``). ``--overload X`` replays 60 s of Poisson arrivals at X times what the workers
carry at the measured mean (seeded) instead of the run's, and prints each rule's answers in time per second as a
share of that capacity. An answer is in time when its wait and its batch time, plus 3 ms for the frontend
and the network, are within the SLA; a refusal is a miss, as in the benchmark's attainment.

What it leaves out: batching (every batch is of one: the runs it was made for, resnet18 at 4x its batch-1 time, served
6,087 batches of one and 12 of two), the frontend's and the load generator's own delays, and the knobs' changes.
It tells the rules apart on the same arrivals and costs; what a rule does on the server is measured there.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from servetune.control.law import SLACK_MS, Cost, completion_ms

NETWORK_MS = 3.0  # the frontend's and the network's part of an answer's time, beyond its wait and its batch


def replay(
    arrivals_ms: np.ndarray,
    times_ms: np.ndarray,
    sla_ms: float,
    workers: int,
    pred_ms: float,
    margin_ms: float | None,
) -> tuple[int, int, int]:
    """(in time, late, refused) for one draw of batch times; ``margin_ms`` None: nothing is refused."""
    cost = Cost(0.0, pred_ms)
    running: dict[int, tuple[float, float, float]] = {}  # worker -> (start, end, arrival)
    queue: list[tuple[float, float]] = []  # (arrival, batch time), first in, first out
    head = 0
    good = late = refused = 0

    def finish_until(t: float) -> None:
        nonlocal good, late, head
        while running:
            worker, (_, end, arrival) = min(running.items(), key=lambda kv: kv[1][1])
            if end > t:
                return
            del running[worker]
            if end - arrival + NETWORK_MS <= sla_ms:
                good += 1
            else:
                late += 1
            if head < len(queue):
                waited, took = queue[head]
                head += 1
                running[worker] = (end, end + took, waited)

    for a, took in zip(arrivals_ms, times_ms, strict=True):
        finish_until(a)
        waiting = len(queue) - head
        idle = waiting == 0 and len(running) < workers
        if margin_ms is not None and not idle:
            busy = [start + pred_ms - a for start, _, _ in running.values()]
            if completion_ms(cost, waiting, 1, busy, workers) + margin_ms + SLACK_MS > sla_ms:
                refused += 1
                continue
        if idle:
            free = next(w for w in range(workers) if w not in running)
            running[free] = (a, a + took, a)
        else:
            queue.append((a, took))
    finish_until(math.inf)
    return good, late, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run's files less their suffix: RUN.npz and RUN.jsonl")
    parser.add_argument("--sla-ms", type=float, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--pred-ms", type=float, default=None, help="a rule predicting this batch time (the run's fit)")
    parser.add_argument("--margin-ms", type=float, default=None, help="... with this margin")
    parser.add_argument("--overload", type=float, default=None, help="60 s of Poisson arrivals at X x capacity")
    args = parser.parse_args()
    arrivals = np.sort(np.load(args.run.with_suffix(".npz"))["start_s"]) * 1000.0
    seconds = (arrivals[-1] - arrivals[0]) / 1000.0
    lines = [json.loads(line) for line in args.run.with_suffix(".jsonl").read_text().splitlines()]
    measured = np.array(
        [b["actual_ms"] for b in lines if b.get("kind") == "batch" and b["size"] == 1 and b["actual_ms"] is not None]
    )
    measured = measured[np.isfinite(measured)]
    mean, sd = float(measured.mean()), float(measured.std())
    capacity = args.workers / mean * 1000.0  # requests a second the workers carry at the mean batch time
    if args.overload is not None:
        seconds = 60.0
        rate = args.overload * capacity
        gaps = np.random.default_rng(100).exponential(1000.0 / rate, size=int(rate * seconds))
        arrivals = np.cumsum(gaps)
        print(f"overload: {rate:.1f} req/s of Poisson arrivals for {seconds:g} s ({args.overload:g}x {capacity:.1f})")
    print(
        f"{len(arrivals)} requests; {len(measured)} batches of one: mean {mean:.1f} ms, median "
        f"{np.median(measured):.1f}, sd {sd:.1f}, P99 {np.percentile(measured, 99):.1f}; SLA {args.sla_ms:g} ms, "
        f"{args.workers} workers, {args.seeds} draws"
    )
    rules: list[tuple[str, float, float | None]] = [("refuse nothing", mean, None)]
    if args.pred_ms is not None:
        rules.append((f"{args.pred_ms:g} ms + {args.margin_ms or 0:g} ms", args.pred_ms, args.margin_ms or 0.0))
    rules += [(f"mean + {z} sd", mean, z * sd) for z in (2, 1, 0)]
    for name, pred, margin in rules:
        runs = []
        for seed in range(args.seeds):
            times = np.random.default_rng(seed).choice(measured, size=len(arrivals))
            runs.append(replay(arrivals, times, args.sla_ms, args.workers, pred, margin))
        share = np.array([g / len(arrivals) for g, _, _ in runs]) * 100
        goodput = np.median([g for g, _, _ in runs]) / seconds / capacity
        print(
            f"{name:>22}: in time {np.median(share):.2f}% ({share.min():.2f}-{share.max():.2f}), late "
            f"{np.median([r[1] for r in runs]):.0f}, refused {np.median([r[2] for r in runs]):.0f}"
            + (f"; in time per second {goodput:.2f} of capacity" if args.overload is not None else "")
        )


if __name__ == "__main__":
    main()
