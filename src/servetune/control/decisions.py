"""The decision log: one JSON object a line for every batch dispatched (why it went, its size, its oldest request's
wait, predicted and actual time) and every knob change (old, new, and the prediction behind it), in a file rotated
at ``max_bytes`` (``decisions.jsonl`` → ``decisions.jsonl.1`` → ...), and the last knob changes kept in memory for
describe. A batch's figures are kept as they are and its line is formatted and written with the others at the
controller's next tick (every 0.1 s), so a batch costs a tuple appended (0.2 µs, where a line formatted and written
cost 2.5 µs: the batch of one is the hot path); a knob change costs a ``json.dumps``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("servetune.control")

PENDING_MAX = 10_000  # records held between ticks at most


class DecisionLog:
    def __init__(self, path: str | None, max_bytes: int = 10 * 2**20, keep: int = 3, recent: int = 20) -> None:
        self.path = Path(path) if path else None
        self.max_bytes = max_bytes
        self.keep = keep
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=recent)
        self._file: IO[str] | None = None
        self._size = 0
        self._quoted: dict[str, str] = {}  # worker id -> its JSON string
        self._pending: list[tuple[Any, ...]] = []  # batches and changes not yet written, in order
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
        threads: int = 0,
    ) -> None:
        """One dispatched batch's line, written at the next :meth:`flush`. ``t`` is seconds since the controller
        started; ``threads``: the worker's intra-op threads, where the controller moves them (0: not written)."""
        if self._file is None:
            return
        self._pending.append((t, worker, reason, size, oldest_queue_ms, predicted_ms, actual_ms, threads))
        if len(self._pending) >= PENDING_MAX:  # ticks late (a loop held up): bound what waits in memory
            self.flush()

    def shed(
        self,
        t: float,
        predicted_ms: float,
        room_ms: float,
        margin_ms: float,
        queue: int,
        running: int,
        own: bool,
    ) -> None:
        """One refused request's line (admission, ``shed: true``): its predicted wait, the time left to its deadline
        (``own``: the client's, else the SLA's), the margin added, the requests queued and the batches running."""
        if self._file is None:
            return
        self._pending.append(("shed", t, predicted_ms, room_ms, margin_ms, queue, running, own))
        if len(self._pending) >= PENDING_MAX:
            self.flush()

    def change(self, record: dict[str, Any]) -> None:
        self.recent.append(record)
        if self._file is not None:
            self._pending.append((json.dumps(record, separators=(",", ":")),))

    def _lines(self, pending: list[tuple[Any, ...]]) -> list[str]:
        """The pending records as JSON lines (a batch's formatted directly: a ``json.dumps`` of a dict costs ~5 µs)."""
        lines = []
        quoted = self._quoted
        for record in pending:
            if len(record) == 1:
                lines.append(record[0] + "\n")
                continue
            if record[0] == "shed":
                _, t, wait, room, margin, queue, running, own = record
                flag = "true" if own else "false"
                lines.append(
                    f'{{"t":{t:.4f},"kind":"shed","predicted_ms":{wait:.3f},"room_ms":{room:.3f},'
                    f'"margin_ms":{margin:.3f},"queue":{queue},"running":{running},"own":{flag}}}\n'
                )
                continue
            t, worker, reason, size, oldest_queue_ms, predicted_ms, actual_ms, threads = record
            name = quoted.get(worker)
            if name is None:
                name = quoted[worker] = json.dumps(worker)
            predicted = "null" if predicted_ms is None else f"{predicted_ms:.3f}"
            more = f',"threads":{threads}' if threads else ""
            lines.append(
                f'{{"t":{t:.4f},"kind":"batch","worker":{name},"reason":"{reason}","size":{size},'
                f'"oldest_queue_ms":{oldest_queue_ms:.3f},"predicted_ms":{predicted},"actual_ms":{actual_ms:.3f}'
                f"{more}}}\n"
            )
        return lines

    def flush(self) -> None:
        """Write what is pending (rotating the file as it fills) and flush it."""
        if self._file is None:
            self._pending.clear()
            return
        pending, self._pending = self._pending, []
        try:
            lines = self._lines(pending)
            text = "".join(lines)
            if self._size + len(text) < self.max_bytes:  # the usual case: one write
                self._file.write(text)
                self._size += len(text)
            else:
                for line in lines:
                    self._file.write(line)
                    self._size += len(line)
                    if self._size >= self.max_bytes:
                        self._rotate()
            self._file.flush()
        except OSError as exc:  # a full disk must not stop the model serving
            log.error("decision log %s: %s; no longer written", self.path, exc)
            self._close_quietly()

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
