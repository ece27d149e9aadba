"""The study's checkpoint: ``trials.jsonl`` in the study folder, a header line then one trial per line, appended
and flushed after every trial. Re-running the same study reads it back and skips those trials; a study whose
fingerprint changed starts fresh (the old file is kept beside it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from servetune.tune.trial import Trial

FORMAT = "servetune-tune-checkpoint/1"


class Checkpoint:
    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.note: str | None = None

    def load(self) -> list[Trial]:
        """Trials recorded by earlier runs of this same study (empty when there are none or the study changed)."""
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        header = _parse(lines[0]) if lines else None
        if not header or header.get("format") != FORMAT or header.get("fingerprint") != self.fingerprint:
            stale = self.path.with_name(f"{self.path.stem}.{time.strftime('%Y%m%d-%H%M%S')}.stale.jsonl")
            self.path.rename(stale)
            self.note = (
                f"the study changed since its checkpoint was written: starting fresh (old one kept: {stale.name})"
            )
            return []
        trials = []
        for number, line in enumerate(lines[1:], start=2):
            data = _parse(line)
            if data is None:
                # A line cut short by a crash is dropped; the trial simply runs again.
                self.note = f"{self.path.name}: line {number} is incomplete and was ignored"
                continue
            trials.append(Trial.from_dict(data))
        return trials

    def rewrite(self, trials: list[Trial]) -> None:
        """Start the file over with the header and ``trials`` (drops any damaged line)."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as handle:
            handle.write(json.dumps({"format": FORMAT, "fingerprint": self.fingerprint}) + "\n")
            for trial in trials:
                handle.write(json.dumps(trial.to_dict()) + "\n")
        os.replace(tmp, self.path)

    def append(self, trial: Trial) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(trial.to_dict()) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def _parse(line: str) -> dict[str, Any] | None:
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None
