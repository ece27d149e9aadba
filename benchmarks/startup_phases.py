"""Time from launching ``servetune serve`` to its first 200 answer, and each phase of the start-up, N starts.

    python benchmarks/startup_phases.py [--model resnet18|noop] [--runs 5] [--baseline /path/to/other/src]
                                        [--peers litserve,bentoml,...]

Launches the real CLI as benchmarks/vs_peers.py does (``benchmarks/peers/servers.py``: the same config.properties,
resnet18 with 2 workers behind the built-in image_classifier, or the no-op model with 1 worker; ready = the first
prediction answered 200, timed from the launch), with ``--log-level debug``, and reads the phases from the
``servetune.startup`` log lines. With ``--baseline SRC`` each run starts the other tree (its ``src`` on PYTHONPATH,
e.g. a ``git worktree`` of main) right after this one, so that machine drift hits both; medians and ranges per tree.
``--peers`` starts those peers of vs_peers (their own venvs) in the same rounds, for their time to the first 200 alone.
Measure one benchmark at a time: ``flock /tmp/servetune-bench.lock python benchmarks/startup_phases.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/: peers/, vs_torchserve
sys.path.insert(0, str(HERE.parent / "examples" / "resnet18"))

from peers.servers import LAUNCHERS, PEERS, Assets, Deployment, Servetune  # noqa: E402

DEPLOYMENTS = {
    "resnet18": Deployment("resnet18", workers=2, batch=8, delay_ms=10),
    "noop": Deployment("noop", workers=1, batch=1, delay_ms=0),
}

# phase name -> pattern of its ``servetune.startup`` line; the first group is the milliseconds
PHASES: list[tuple[str, str]] = [
    ("frontend interpreter", r"start-up: interpreter (\d+) ms"),
    ("frontend CLI imports", r"CLI imports (\d+) ms"),
    ("frontend backend+API imports", r"backend and API imports, config (\d+) ms"),
    ("frontend HTTP bind", r"HTTP APIs bound (\d+) ms"),
    ("frontend gRPC import+bind", r"gRPC imported and bound (\d+) ms"),
    ("archive extraction", r"archive \S+ opened .*? (\d+) ms"),
    ("parent spawn to preloaded", r"parent \(pid \d+\) preloaded \(\w+\) (\d+) ms after spawn"),
    ("parent interpreter", r"preloaded .* interpreter (\d+) ms"),
    ("parent servetune imports", r"preloaded .* servetune imports (\d+) ms"),
    ("parent early imports", r"preloaded .* early imports \([^)]*\) (\d+) ms"),
    ("parent handler import+model load", r"preloaded .* (?:handler import and model load|handler import) (\d+) ms"),
    ("parent started after exec", r"\(spawned (\d+) ms after exec\)"),
    ("worker ready after fork request (max)", r"worker \d+ \(pid \d+\) ready (\d+) ms after its fork request"),
    ("worker spawn to ready (max)", r"worker \d+ \(pid \d+\) ready (\d+) ms after spawn"),
    ("frontend: ready after exec", r"ready (\d+) ms after exec"),
]


class Traced(Servetune):
    """servetune as vs_peers launches it, from the tree ``src`` (PYTHONPATH), logging its start-up at debug."""

    src = ""

    def command(self) -> list[str]:
        return [*super().command(), "--log-level", "debug"]

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = self.src
        return env


def phases(log: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, pattern in PHASES:
        values = [float(m) for m in re.findall(pattern, log)]
        if values:
            found[name] = max(values)
    return found


def start_once(src: str, deployment: Deployment, assets: Assets) -> dict[str, float]:
    server = type("Run", (Traced,), {"src": src})(deployment, assets, None)
    try:
        server.start(timeout=300)
        time.sleep(0.2)  # the last start-up line is written right after registration; let it reach the log
        found = phases(server.log_tail(200_000))
    finally:
        server.stop()
    found["time to first 200 (launch to answer)"] = server.ready_s * 1000.0
    return found


def start_peer(name: str, deployment: Deployment, assets: Assets) -> dict[str, float]:
    from peers.venvs import venv_python

    server = LAUNCHERS[name](deployment, assets, venv_python(name))
    try:
        server.start(timeout=300)
    finally:
        server.stop()
    return {"time to first 200 (launch to answer)": server.ready_s * 1000.0}


def build(work: Path) -> Assets:
    from vs_peers import build_assets

    return build_assets(work)


def report(label: str, runs: list[dict[str, float]]) -> None:
    print(f"\n{label}: {len(runs)} starts, ms: median (min-max)")
    names = [n for n, _ in PHASES] + ["time to first 200 (launch to answer)"]
    for name in names:
        values = [r[name] for r in runs if name in r]
        if values:
            print(f"  {name:42s} {statistics.median(values):7.0f} ({min(values):.0f}-{max(values):.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(DEPLOYMENTS), default="resnet18")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", metavar="SRC", help="another tree's src directory, started interleaved")
    parser.add_argument("--assets", metavar="DIR", help="reuse the archives built here by an earlier run")
    parser.add_argument("--peers", default="", help=f"comma-separated, of {', '.join(PEERS)}")
    args = parser.parse_args()
    mine = str(HERE.parent / "src")
    trees = [("this tree", mine)] + ([("baseline", args.baseline)] if args.baseline else [])
    trees += [(name, "") for name in args.peers.split(",") if name]
    with open("/proc/loadavg") as fh:
        print(f"load average before: {fh.read().strip()}")
    with tempfile.TemporaryDirectory(prefix="startup-phases-") as tmp:
        work = Path(args.assets) if args.assets else Path(tmp)
        if args.assets and (work / "store").is_dir():
            assets = Assets(work / "store", work / "model", work / "sample.png", work / "hello.txt")
        else:
            work.mkdir(parents=True, exist_ok=True)
            assets = build(work)
        results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
        for run in range(args.runs):
            order = trees[run % len(trees) :] + trees[: run % len(trees)]  # rotate who goes first
            for label, src in order:
                if src:
                    found = start_once(src, DEPLOYMENTS[args.model], assets)
                else:
                    found = start_peer(label, DEPLOYMENTS[args.model], assets)
                results[label].append(found)
                ready = found["time to first 200 (launch to answer)"]
                print(f"run {run + 1} {label}: ready {ready:.0f} ms", flush=True)
    for label, _ in trees:
        report(label, results[label])
    with open("/proc/loadavg") as fh:
        print(f"\nload average after: {fh.read().strip()}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
