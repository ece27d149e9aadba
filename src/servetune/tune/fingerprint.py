"""A study's fingerprint: a digest of everything that changes a measurement (the space, load, SLA, objective,
strategy, backend and its options, and the content of the archives, inputs and hooks), and of nothing else (the
budget, notes, where the study file lives, a cluster's address), so that a study resumes from its checkpoint
exactly when its trials would measure the same thing.

Fields added after version 1 are left out while they hold their default, and ``options`` are spelled as the fields
they once were, so checkpoints written before those fields existed still resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servetune.tune.study import Study

FINGERPRINT_VERSION = 1
# references add trials and change none; extra_families are the tuner's own (the online controller's, ``online.py``)
UNMEASURED = ("budget", "notes", "source", "backend_address", "references", "extra_families")
UNMEASURED_STRATEGY = ("controller",)  # adds the online controller's rounds after the search, changes no trial
# field -> default, for fields that came after version 1
LATER_STUDY: dict[str, Any] = {
    "backend": "native", "options": {}, "models": (), "pipeline": (), "mix": (), "sla_scale": (),
    # 0.25 was the default when contention came; since 0.15 (2026-12-03), a default study's fingerprint differs from
    # checkpoints measured under 0.25, as it should: their runs were judged contended by another rule
    "contention": {"max_other_cores": 0.25, "retries": 2},
}  # fmt: skip
LATER_LOAD: dict[str, Any] = {
    "protocol": "torchserve", "early_stop": True, "max_duration_s": None, "trace": None, "trace_format": None,
    "trace_options": (), "time_scale": 1.0, "rate_scale": 1.0, "capacity_fraction": None,
}  # fmt: skip
LATER_STRATEGY: dict[str, Any] = {"finalists": 2, "rounds": 3}
LATER_FAMILY: dict[str, Any] = {
    "options": {}, "model": "", "threads": (0,), "inter_op_threads": (0,), "pinning": (False,),
}  # fmt: skip


def fingerprint(study: Study) -> str:
    data = dataclasses.asdict(study)
    for key in UNMEASURED:
        data.pop(key, None)
    _flatten(data, LATER_STUDY)
    for key in UNMEASURED_STRATEGY:
        data["strategy"].pop(key, None)
    _flatten(data["strategy"], LATER_STRATEGY)
    for model in data.get("models", ()):
        _flatten(model["baseline_family"], LATER_FAMILY)
        _flatten(model["baseline_family"]["load"], LATER_LOAD)
    for family in (*data["families"], data["baseline_family"]):
        _flatten(family, LATER_FAMILY)
        _flatten(family["load"], LATER_LOAD)
    payload = json.dumps([FINGERPRINT_VERSION, data, digests(study)], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _flatten(data: dict[str, Any], later: Mapping[str, Any]) -> None:
    """Drop later fields at their default; spell ``options`` as top-level keys."""
    for key, default in later.items():
        if key in data and data[key] == default:
            data.pop(key)
    data.update(data.pop("options", None) or {})


def digests(study: Study) -> dict[str, str]:
    """Content digest of every archive, input and hook file the study reads."""
    from servetune.bench.hooks import HOOKS, hook_path

    families = (*study.families, study.baseline_family, *(m.baseline_family for m in study.models))
    folder = study.source.parent if study.source is not None else None
    paths: Iterable[Path] = [
        *(f.archive for f in families),
        *(f.load.trace for f in study.families if f.load.trace is not None),
        *(f.input for f in study.families if f.input is not None),
        *(hook_path(s.request, folder) for s in study.pipeline if s.request not in (*HOOKS, "input")),
    ]
    return {str(path): digest(path) for path in paths}


def digest(path: Path) -> str:
    """Content digest of a file; for a directory, of its file names, sizes and modification times."""
    if path.is_file():
        h = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    if path.is_dir():
        entries = sorted(
            (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()
        )
        return hashlib.sha256(json.dumps(entries).encode()).hexdigest()
    return "missing"
