"""The progress bar while a study runs (rich): trials done of the expected total, ETA, best so far; and one line
per trial above it (also the whole output when stderr is not a terminal)."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class TuneProgress:
    def __init__(self, console: Console, title: str, *, budget_s: float | None = None) -> None:
        self.console = console
        self.budget_s = budget_s
        self.started = time.monotonic()
        self.measured_s: list[float] = []
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("trials"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            TextColumn("best: {task.fields[best]}"),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._task = self._bar.add_task(title, total=1, eta="?", best="none yet")

    def __enter__(self) -> TuneProgress:
        self._bar.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._bar.__exit__(exc_type, exc, tb)

    def eta(self, remaining: int) -> str:
        if not self.measured_s:
            return "?"
        seconds = remaining * sum(self.measured_s) / len(self.measured_s)
        if self.budget_s is not None:
            seconds = min(seconds, max(0.0, self.budget_s - (time.monotonic() - self.started)))
        minutes, secs = divmod(int(seconds), 60)
        return f"{minutes}:{secs:02d}"

    def update(self, done: int, remaining: int, best: str, *, wall_s: float | None = None) -> None:
        if wall_s is not None:
            self.measured_s.append(wall_s)
        self._bar.update(self._task, completed=done, total=done + max(remaining, 0), eta=self.eta(remaining), best=best)

    def line(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)
