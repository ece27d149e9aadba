"""The decision log: one JSON object a line for every batch dispatched (why it went, its size, its oldest request's
wait, predicted and actual time) and every knob change (old, new, and the prediction behind it), in a file rotated
at ``max_bytes`` (``decisions.jsonl`` → ``decisions.jsonl.1`` → ...), and the last knob changes kept in memory for
describe. Lines are buffered and flushed at every controller tick, so a batch costs a line formatted (a knob change
a ``json.dumps``), not a write.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("servetune.control")


class DecisionLog:
    def __init__(self, path: str | None, max_bytes: int = 10 * 2**20, keep: int = 3, recent: int = 20) -> None:
        self.path = Path(path) if path else None
        self.max_bytes = max_bytes
        self.keep = keep
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=recent)
        self._file: IO[str] | None = None
        self._size = 0
        self._quoted: dict[str, str] = {}  # worker id -> its JSON string
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held open for the model's life)
            self._size = self._file.tell()

    def batch(
        self,
        t: float,
        worker: str,
        reason: str,
        size: int,
        oldest_queue_ms: float,
        predicted_ms: float | None,
        actual_ms: float,
    ) -> None:
        """One dispatched batch's line (formatted directly: a batch is the log's hot path, a ``json.dumps`` of a dict
        cost ~5 µs of it). ``t`` is seconds since the controller started."""
        if self._file is None:
            return
        quoted = self._quoted.get(worker)
        if quoted is None:
            quoted = self._quoted[worker] = json.dumps(worker)
        predicted = "null" if predicted_ms is None else f"{predicted_ms:.3f}"
        self._write_line(
            f'{{"t":{t:.4f},"kind":"batch","worker":{quoted},"reason":"{reason}","size":{size},'
            f'"oldest_queue_ms":{oldest_queue_ms:.3f},"predicted_ms":{predicted},"actual_ms":{actual_ms:.3f}}}\n'
        )

    def change(self, record: dict[str, Any]) -> None:
        self.recent.append(record)
        if self._file is not None:
            self._write_line(json.dumps(record, separators=(",", ":")) + "\n")

    def _write_line(self, line: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(line)
        except OSError as exc:  # a full disk must not stop the model serving
            log.error("decision log %s: %s; no longer written", self.path, exc)
            self._close_quietly()
            return
        self._size += len(line)
        if self._size >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        assert self.path is not None and self._file is not None
        self._file.close()
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = 0

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                log.error("decision log %s: %s; no longer written", self.path, exc)
                self._close_quietly()

    def _close_quietly(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass

    def close(self) -> None:
        self.flush()
        self._close_quietly()


__all__ = ["DecisionLog"]
