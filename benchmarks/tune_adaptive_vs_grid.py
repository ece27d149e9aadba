"""Adaptive search against the full grid on the same space, measured in one run.

Two models:
- ``cost``: the known-cost model of the tuner's tests (each batch 100 ms + 20 ms x batch size, at most 2 batches at
  once whatever the workers), 6 workers x 6 batch sizes x 2 delays = 72 configs, closed loop with batch x workers
  clients, SLA P99 <= 300 ms;
- ``resnet18``: ResNet-18 on CPU behind the built-in image_classifier (examples/resnet18), 4 workers x 5 batch sizes
  x 3 delays = 60 configs, one intra-op thread per worker, SLA P99 <= --resnet-sla ms.

    python benchmarks/tune_adaptive_vs_grid.py [--models cost,resnet18] [--duration 2] [--out DIR]

Prints, per model: the grid's best config and objective, the adaptive search's, the ratio of their objectives
(target >= 0.95), the grid's own measurement of the adaptive winner against its best, and the ratio of wall times
(target <= 0.25). Both studies run on this machine one after the other; nothing else should be running.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples" / "resnet18"))

from servetune.tune import TuneResult, load_study, tune  # noqa: E402
from servetune.tune.trial import summarise  # noqa: E402


def cost_study(folder: Path, duration: float) -> dict[str, Any]:
    from tune_models import cost_archive

    archive = cost_archive(folder / "store", folder / "locks", a_ms=100, b_ms=20, slots=2)
    return {
        "model": "cost",
        "archive": str(archive),
        "sla": {"p99_ms": 300},
        "space": {"workers": [1, 2, 3, 4, 6, 8], "batch_size": [1, 2, 4, 8, 16, 32], "batch_delay_ms": [10, 50]},
        "load": {"duration": f"{duration}s", "warmup": "0.5s"},
    }


def resnet_study(folder: Path, duration: float, sla_ms: float) -> dict[str, Any]:
    from make_archive import build, sample_image

    archive = build(folder / "store")
    image = sample_image(folder / "kitten.png")
    return {
        "model": "resnet18",
        "archive": str(archive),
        "input": str(image),
        "sla": {"p99_ms": sla_ms},
        "space": {"workers": [1, 2, 3, 4], "batch_size": [1, 2, 4, 8, 16], "batch_delay_ms": [5, 25, 50]},
        "load": {"duration": f"{duration}s", "warmup": "1s"},
        # One intra-op thread per worker: on a small shared machine two OpenMP threads per worker stall badly
        # whenever another process takes a core, which would drown what the knobs do.
        "server": {"threads_per_worker": 1},
    }


def run(study: dict[str, Any], strategy: str, folder: Path, console: Console) -> tuple[TuneResult, float]:
    path = folder / f"{strategy}.yaml"
    path.write_text(yaml.safe_dump({**study, "strategy": {"name": strategy, "remeasure": 3}}))
    started = time.monotonic()
    result = tune(load_study(path), folder / f"{strategy}-out", console=console)
    if result.stopped == "interrupted":
        raise KeyboardInterrupt
    return result, time.monotonic() - started


def compare(name: str, study: dict[str, Any], folder: Path, console: Console) -> bool:
    grid, grid_s = run(study, "grid", folder, console)
    adaptive, adaptive_s = run(study, "adaptive", folder, console)
    g, a = grid.analysis.winner, adaptive.analysis.winner
    print(f"\n== {name}: {grid.study.size} configs, {grid.study.sla.describe()}")
    print(f"grid:     {len(grid.trials):3d} trials in {grid_s:7.1f} s; best {g.config.key if g else None}: "
          f"{g.verdict.objective if g else 0:.1f} req/s")  # fmt: skip
    print(f"adaptive: {len(adaptive.trials):3d} trials in {adaptive_s:7.1f} s; best {a.config.key if a else None}: "
          f"{a.verdict.objective if a else 0:.1f} req/s")  # fmt: skip
    if g is None or a is None:
        print("no config met the SLA in one of the runs: nothing to compare")
        return False
    objective = a.verdict.objective / g.verdict.objective
    same_run = summarise(a.config, grid.trials, grid.study).verdict.objective / g.verdict.objective
    wall = adaptive_s / grid_s
    print(f"adaptive/grid objective: {objective:.3f} (target >= 0.95); the grid's own measurement of the adaptive "
          f"winner: {same_run:.3f}")  # fmt: skip
    print(f"adaptive/grid wall time: {wall:.3f} (target <= 0.25); trials {len(adaptive.trials) / len(grid.trials):.3f}")
    ok = objective >= 0.95 and wall <= 0.25
    print("PASS" if ok else "FAIL")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cost,resnet18", help="comma-separated: cost, resnet18")
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per load run")
    parser.add_argument("--resnet-sla", type=float, default=250.0, help="P99 SLA (ms) for resnet18")
    parser.add_argument("--out", type=Path, help="keep the study folders here (default: a temporary folder)")
    args = parser.parse_args()
    console = Console(stderr=True)
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C, so the embedded server is stopped too
    with tempfile.TemporaryDirectory(prefix="servetune-tune-bench-") as tmp:
        root = args.out or Path(tmp)
        results = []
        for name in args.models.split(","):
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            if name == "cost":
                study = cost_study(folder, args.duration)
            elif name == "resnet18":
                study = resnet_study(folder, args.duration, args.resnet_sla)
            else:
                parser.error(f"unknown model {name!r}")
            results.append(compare(name, study, folder, console))
    return 0 if all(results) else 1


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
