"""A live progress line on stderr while a run goes on (only when stderr is a terminal).

Engines bump the counters; a ticker on the same event loop redraws at most a few times a second. The redraw is
kept short on purpose: anything slow on the client's loop would delay scheduled sends.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any

from rich.text import Text


class Progress:
    """Counters an engine updates (``done``, ``failed``, ``phase``) and, when enabled, a rich live line."""

    def __init__(self, enabled: bool = False, requests: int | None = None, seconds: float | None = None) -> None:
        self.done = 0
        self.failed = 0
        self.phase = "starting"
        self.requests = requests
        self.seconds = seconds
        self._started = time.perf_counter()
        self._live: Any = None
        self._task: asyncio.Task[None] | None = None
        self.enabled = enabled
        if enabled:
            from rich.console import Console
            from rich.live import Live

            console = Console(stderr=True)
            self.enabled = console.is_terminal
            if self.enabled:
                self._live = Live(console=console, auto_refresh=False, transient=True)

    def set_phase(self, phase: str) -> None:
        """Start a new phase (warm-up, measuring): counters and the clock restart."""
        self.phase = phase
        self.done = 0
        self.failed = 0
        self._started = time.perf_counter()

    def line(self) -> str:
        elapsed = time.perf_counter() - self._started
        parts = [f"{self.phase}: {self.done} done"]
        if self.requests and self.phase == "measuring":
            parts[0] += f" / {self.requests}"
        parts.append(f"{self.failed} failed")
        clock = f"{elapsed:.1f}s" + (f" / {self.seconds:g}s" if self.seconds and self.phase == "measuring" else "")
        parts.append(clock)
        if elapsed > 0:
            parts.append(f"{self.done / elapsed:.0f} req/s")
        return "  ".join(parts)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            self._live.update(Text(self.line()), refresh=True)

    async def __aenter__(self) -> Progress:
        if self._live is not None:
            self._live.start()
            self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._live is not None:
            self._live.stop()
