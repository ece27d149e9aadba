"""Does the tuner name the same winner when the same study runs again, idle and with another process busy?

    python benchmarks/tune_repeatability.py [--study resnet18|cost|FILE.yaml] [--runs 5] [--hog]
                                            [--hog-on 20] [--hog-off 20] [--duration 5] [--baseline-src PATH]
                                            [--out DIR] [--json FILE] [--quick]

Runs one study ``--runs`` times on this machine as it is (meant to be idle), then, with ``--hog``, as many times
again while a CPU hog (a process spinning on one core, pinned to the last one) runs ``--hog-on`` seconds out of
every ``--hog-on + --hog-off``: part of each run. Every run is ``python -m servetune tune`` in a process of its own,
with ``src/`` of this checkout on PYTHONPATH, or of ``--baseline-src PATH`` too (another checkout, e.g. the previous
commit's, for the same runs under the old code; the study file uses only keys both understand).

Studies: ``resnet18`` (ResNet-18 on CPU behind the built-in image_classifier, examples/resnet18: 1-3 workers x
batch 1-8, one thread per worker, SLA P99 <= 300 ms; the configs that the issue saw measured 43.0 and 35.4 req/s
in two runs), ``cost`` (the tests' known-cost model: 100 ms + 20 ms x batch, 2 slots; short: for checking the
script), or a study file.

Prints, per code (this checkout, the baseline) and per condition (idle, hog):
- each run's winner, its throughput, the default config's throughput, and the interference it saw (the most CPU
  other processes used in any of its load runs, its contended trials);
- how many runs name the most frequent winner, counting a run that named another config *and* reported it
  indistinguishable from that winner (target: >= 9 of 10 runs);
- the spread of one config's measured throughput across the idle runs (the default config, measured in every run;
  and the most frequent winner where it was measured): the largest deviation from their mean (target: within +-3%),
  and the winner's throughput max/min across all runs.
The lead measures this on a quiet machine (5 idle runs, 5 with the hog, both codes); ``--quick`` (the cost study,
1 run per condition, 1 s load runs) only checks that the script works.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples" / "resnet18"))

WINNER = re.compile(r"^winner: (.+)$", re.MULTILINE)
HEADLINE = re.compile(r"^(.+?): ([\d.]+) req/s at P99", re.MULTILINE)
TIE = re.compile(r"^(.+?) and (.+?) are indistinguishable at this noise level", re.MULTILINE)
KNOBS = re.compile(r"(\d+) workers?, batch (\d+), delay (\d+) ms(?:, (\d+) threads? each)?")
SAME_WINNER_TARGET, SPREAD_TARGET = 0.9, 0.03


def cost_study(folder: Path, duration: float) -> dict[str, Any]:
    from tune_models import cost_archive

    archive = cost_archive(folder / "store", folder / "locks", a_ms=100, b_ms=20, slots=2)
    return {
        "model": "cost",
        "archive": str(archive),
        "sla": {"p99_ms": 300},
        "space": {"workers": [1, 2, 3], "batch_size": [1, 2, 4, 8], "batch_delay_ms": [25]},
        "load": {"duration": f"{duration}s", "warmup": "0.5s"},
        "strategy": "adaptive",
    }


def resnet_study(folder: Path, duration: float) -> dict[str, Any]:
    from make_archive import build, sample_image

    archive = build(folder / "store")
    image = sample_image(folder / "kitten.png")
    return {
        "model": "resnet18",
        "archive": str(archive),
        "input": str(image),
        "sla": {"p99_ms": 300},
        "space": {"workers": [1, 2, 3], "batch_size": [1, 2, 4, 8], "batch_delay_ms": [25], "threads": [1]},
        "load": {"duration": f"{duration}s", "warmup": "1s"},
        "strategy": "adaptive",
    }


class Hog:
    """A process spinning on one core (the last), on for ``on_s`` out of every ``on_s + off_s`` seconds."""

    def __init__(self, on_s: float, off_s: float) -> None:
        core = (os.cpu_count() or 1) - 1
        code = (
            "import os, time\n"
            f"os.sched_setaffinity(0, {{{core}}}) if hasattr(os, 'sched_setaffinity') else None\n"
            "while True:\n"
            f"    end = time.monotonic() + {on_s}\n"
            "    while time.monotonic() < end:\n"
            "        pass\n"
            f"    time.sleep({off_s})\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class RunResult:
    code: str
    condition: str
    index: int
    exit_status: int
    wall_s: float
    winner: str | None
    winner_rps: float | None
    default_rps: float | None
    config_rps: dict[str, float] = field(default_factory=dict)  # knobs -> mean measured throughput in this run
    ties: list[tuple[str, str]] = field(default_factory=list)
    others_cores: float | None = None
    contended_trials: int = 0


def knobs_of(description: str) -> str | None:
    match = KNOBS.search(description)
    if match is None:
        return None
    workers, batch, delay, threads = match.groups()
    return f"w{workers} b{batch} d{delay}" + (f" t{threads}" if threads else "")


def read_run(out: Path) -> tuple[float | None, dict[str, float], float | None, int]:
    """From a run's checkpoint (either code's): the default config's throughput, each config's mean throughput,
    the most CPU other processes used in a load run, and the contended trials."""
    per_config: dict[str, list[float]] = collections.defaultdict(list)
    default = others = None
    contended = 0
    path = out / "trials.jsonl"
    lines = path.read_text().splitlines()[1:] if path.exists() else []
    for number, line in enumerate(lines):
        trial = json.loads(line)
        result = trial.get("result")
        if not result:
            continue
        c = trial["config"]
        key = f"w{c['workers']} b{c['batch_size']} d{c['batch_delay_ms']}" + (
            f" t{c['threads']}" if c.get("threads") else ""
        )
        per_config[key].append(float(result["throughput_rps"]))
        if number == 0:
            default = float(result["throughput_rps"])
        host = result.get("host")
        if host:
            others = max(others or 0.0, float(host["others_cores"]))
            contended += bool(host.get("contended"))
    return default, {k: statistics.fmean(v) for k, v in per_config.items()}, others, contended


def one_run(code: str, src: Path, study: Path, out: Path, condition: str, index: int) -> RunResult:
    env = {**os.environ, "PYTHONPATH": str(src)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "servetune", "tune", str(study), "--out", str(out)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    text = done.stdout
    winner = WINNER.search(text)
    headline = HEADLINE.search(text)
    default, per_config, others, contended = read_run(out)
    ties = [(knobs_of(a) or a, knobs_of(b) or b) for a, b in TIE.findall(text)]
    result = RunResult(
        code, condition, index, done.returncode, round(wall, 1),
        knobs_of(winner.group(1)) if winner else None,
        float(headline.group(2)) if headline and winner else None,
        default, per_config, ties, others, contended,
    )  # fmt: skip
    if done.returncode not in (0, 1, 3):
        print(done.stderr[-3000:], file=sys.stderr)
    return result


def summarise(runs: list[RunResult]) -> dict[str, Any]:
    winners = [r.winner for r in runs if r.winner]
    if not winners:
        return {"runs": len(runs), "same_winner": 0, "modal": None}
    modal, _ = collections.Counter(winners).most_common(1)[0]
    same = sum(1 for r in runs if r.winner == modal or (r.winner and {r.winner, modal} in map(set, r.ties)))
    idle = [r for r in runs if r.condition == "idle"]
    default = [r.default_rps for r in idle if r.default_rps]
    modal_idle = [r.config_rps[modal] for r in idle if modal in r.config_rps]
    modal_all = [r.config_rps[modal] for r in runs if modal in r.config_rps]

    def deviation(values: list[float]) -> float | None:
        if len(values) < 2:
            return None
        mean = statistics.fmean(values)
        return max(abs(v - mean) for v in values) / mean

    return {
        "runs": len(runs),
        "modal": modal,
        "same_winner": same,
        "default_idle_deviation": deviation(default),
        "winner_idle_deviation": deviation(modal_idle),
        "winner_max_over_min": max(modal_all) / min(modal_all) if modal_all else None,
    }


def report(code: str, runs: list[RunResult]) -> dict[str, Any]:
    print(f"\n== {code}")
    print(f"{'run':<10} {'exit':>4} {'wall s':>7}  {'winner':<18} {'req/s':>7} {'default req/s':>13} "
          f"{'others cores':>12} {'contended':>9}")  # fmt: skip
    for r in runs:
        others = "" if r.others_cores is None else f"{r.others_cores:.2f}"
        print(f"{r.condition + ' ' + str(r.index):<10} {r.exit_status:>4} {r.wall_s:7.0f}  {str(r.winner):<18} "
              f"{r.winner_rps or float('nan'):7.1f} {r.default_rps or float('nan'):13.1f} {others:>12} "
              f"{r.contended_trials:>9}")  # fmt: skip
        for a, b in r.ties:
            print(f"{'':10} reported indistinguishable: {a} / {b}")
    summary = summarise(runs)
    if summary["modal"] is None:
        print("no run named a winner")
        return summary
    same, total = summary["same_winner"], summary["runs"]
    ok = "met" if same >= SAME_WINNER_TARGET * total else "NOT met"
    print(f"the same winner ({summary['modal']}, or one reported indistinguishable from it): {same} of {total} runs "
          f"(target >= {SAME_WINNER_TARGET:.0%}: {ok})")  # fmt: skip
    for key, label in (("default_idle_deviation", "the default config"), ("winner_idle_deviation", "the winner")):
        value = summary[key]
        if value is None:
            print(f"{label}'s throughput across idle runs: fewer than 2 idle runs measured it")
        else:
            ok = "met" if value <= SPREAD_TARGET else "NOT met"
            print(f"{label}'s throughput across idle runs: within +-{100 * value:.1f}% of its mean "
                  f"(target +-{100 * SPREAD_TARGET:.0f}%: {ok})")  # fmt: skip
    if summary["winner_max_over_min"] is not None:
        print(f"the winner's throughput across all runs that measured it: max/min {summary['winner_max_over_min']:.3f}")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="resnet18", help="resnet18, cost, or a study file")
    parser.add_argument("--runs", type=int, default=5, help="runs per condition")
    parser.add_argument("--hog", action="store_true", help="then as many runs with a CPU hog on one core")
    parser.add_argument("--hog-on", type=float, default=20.0, help="seconds the hog spins, in each cycle")
    parser.add_argument("--hog-off", type=float, default=20.0, help="seconds the hog sleeps, in each cycle")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per load run (built-in studies)")
    parser.add_argument("--baseline-src", type=Path, help="another checkout's src/: the same runs under its code")
    parser.add_argument("--out", type=Path, help="keep the runs' folders here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write every run and the summaries here")
    parser.add_argument("--quick", action="store_true", help="a check of the script: cost study, 1 run, 1 s runs")
    args = parser.parse_args()
    if args.quick:
        args.study, args.runs, args.duration = "cost", 1, 1.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    codes = [("this checkout", ROOT / "src")]
    if args.baseline_src is not None:
        if not (args.baseline_src / "servetune").is_dir():
            parser.error(f"--baseline-src {args.baseline_src}: expected a src/ folder holding servetune/")
        codes.append((f"baseline ({args.baseline_src})", args.baseline_src.resolve()))
    conditions = ["idle"] + (["hog"] if args.hog else [])
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; study {args.study}; {args.runs} run(s) "
          f"per condition ({', '.join(conditions)}); hog {args.hog_on:g} s on / {args.hog_off:g} s off")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="servetune-repeat-") as tmp:
        root = (args.out or Path(tmp)).resolve()
        root.mkdir(parents=True, exist_ok=True)
        if args.study in ("resnet18", "cost"):
            build = resnet_study if args.study == "resnet18" else cost_study
            study_path = root / "study.yaml"
            study_path.write_text(yaml.safe_dump(build(root / "model", args.duration)))
        else:
            study_path = Path(args.study).resolve()
        results: dict[str, list[RunResult]] = {code: [] for code, _ in codes}
        for condition in conditions:
            for index in range(1, args.runs + 1):
                for code, src in codes:  # the codes take turns, so drift in the machine hits both alike
                    hog = Hog(args.hog_on, args.hog_off) if condition == "hog" else None
                    try:
                        out = root / f"{code.split()[0]}-{condition}-{index}"
                        run = one_run(code, src, study_path, out, condition, index)
                    finally:
                        if hog is not None:
                            hog.stop()
                    results[code].append(run)
                    print(f"{code}, {condition} run {index}: winner {run.winner} ({run.winner_rps} req/s), exit "
                          f"{run.exit_status}, {run.wall_s:.0f} s", flush=True)  # fmt: skip
        summaries = {code: report(code, runs) for code, runs in results.items()}
    if args.json is not None:
        data = {"runs": {code: [asdict(r) for r in runs] for code, runs in results.items()}, "summaries": summaries}
        args.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
