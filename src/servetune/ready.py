"""The ready file: how a ``servetune serve`` process tells whoever started it that it is up, and where.

``servetune serve --ready-file PATH`` writes one JSON object, atomically (a temporary file renamed over PATH), once
the server is ready: its APIs are bound and every start-up model has been loaded or has failed to load.

    {"pid": 1234, "backend": "native",
     "urls": {"inference": "http://127.0.0.1:40123", "management": "...", "metrics": "...",
              "grpc_inference": "grpc://127.0.0.1:40125", "grpc_management": "grpc://127.0.0.1:40126"},
     "models": {"resnet18": ["1.0"]},
     "failed": {"broken.mar": "Failed to start workers for model broken ...: ValueError: ..."}}

A machine-readable contract instead of lines printed for people (the tuner, benchmarks and tests read it).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ReadyInfo:
    pid: int
    backend: str
    urls: dict[str, str]
    models: dict[str, list[str]] = field(default_factory=dict)  # name -> versions registered
    failed: dict[str, str] = field(default_factory=dict)  # start-up model (name or url) -> why it did not load

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> ReadyInfo:
        raw: dict[str, Any] = json.loads(path.read_text())
        return cls(
            pid=int(raw["pid"]),
            backend=str(raw["backend"]),
            urls={str(k): str(v) for k, v in raw["urls"].items()},
            models={str(k): [str(x) for x in v] for k, v in (raw.get("models") or {}).items()},
            failed={str(k): str(v) for k, v in (raw.get("failed") or {}).items()},
        )


__all__ = ["ReadyInfo"]
