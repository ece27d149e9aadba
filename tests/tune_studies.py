"""Study files for the loader's tests: the case study's YAML, a small native study, and how to check a refusal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from servetune._exceptions import ConfigError
from servetune.tune import load_study

# The Animated Drawings case study's auto-benchmark config, as TorchServe users write it.
CASE_STUDY = """
drawn_humanoid_detector:
    eager_mode:
        benchmark_engine: "ab"
        url: "file://{archive}"
        workers:
            - 1
            - 4
        batch_delay: 100
        batch_size:
            - 1
            - 2
            - 4
            - 8
        requests: 10000
        concurrency: 10
        input: "{input}"
        backend_profiling: False
        exec_env: "local"
        processors:
            - "cpu"
            - "gpus": "all"
"""


def study_files(tmp_path: Path) -> Path:
    """A (fake) archive and input in ``tmp_path``: enough for a study file to be read."""
    (tmp_path / "model.mar").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    (tmp_path / "input.png").write_bytes(b"\x89PNG")
    return tmp_path


def write(folder: Path, data: Any, name: str = "study.yaml") -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def native(**changes: Any) -> dict[str, Any]:
    study: dict[str, Any] = {
        "archive": "model.mar",
        "input": "input.png",
        "sla": {"p99_ms": 100},
        "space": {"workers": [1, 2], "batch_size": [1, 4], "batch_delay_ms": [10]},
    }
    study.update(changes)
    return study


def refused(folder: Path, data: Any, pattern: str, devices: set[str] | None = None) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_study(write(folder, data), devices=devices or {"cpu"})
