"""The winner each recorded tuning run would name under this checkout's rules, from the trials it measured.

    python benchmarks/tune_reanalyse.py RUN_DIR [RUN_DIR ...]

A run folder is one of ``tune_repeatability.py --out DIR``'s (``trials.jsonl`` and the study beside it,
``../study.yaml``). Nothing is measured again: the search and the finalists' rounds are read back as they were run,
and only the analysis (which finalists are compared, which one is chosen) is this checkout's. It answers "would the
new rule have chosen differently on the same figures?"; it says nothing about the trials a changed search would
have measured (the runs' own winner, as printed then, is shown beside it). The study's SLA is the one the run used.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from pathlib import Path

from servetune.tune.analysis import analyse
from servetune.tune.finalists import sentence
from servetune.tune.loader import load_study
from servetune.tune.report import describe
from servetune.tune.study import Point, Study
from servetune.tune.trial import Trial

SHORT = re.compile(r"(\d+) workers?, batch (\d+)")


def short(text: str) -> str:
    found = SHORT.search(text)
    return f"{found.group(1)}x{found.group(2)}" if found else text


def name_of(point: Point, study: Study) -> str:
    return short(describe(point, study))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--study", type=Path, help="the study file (default: study.yaml beside the run folders)")
    args = parser.parse_args()
    for run in args.runs:
        study_path = args.study or run.parent / "study.yaml"
        study = load_study(study_path)
        lines = (run / "trials.jsonl").read_text().splitlines()[1:]
        trials = [Trial.from_dict(json.loads(line)) for line in lines if line.strip()]
        then = re.search(r"^- config: (.+)$", (run / "report.md").read_text(), re.MULTILINE)
        analysis = analyse(study, trials)
        now = describe(analysis.winner.config, study) if analysis.winner else "none"
        name = functools.partial(name_of, study=study)
        ties = [sentence(c, name) for c in analysis.finalists.comparisons] if analysis.finalists else []
        print(f"{run.name:<12} then {short(then.group(1)) if then else '?':<6} now {short(now):<6} "
              f"{'; '.join(ties)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
