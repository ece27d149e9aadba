"""The live progress line: counters, its text, and that it stays off when stderr is not a terminal."""

from __future__ import annotations

import asyncio

from servetune.bench.progress import Progress


def test_line_shows_counts_and_rate() -> None:
    progress = Progress(requests=200, seconds=None)
    progress.set_phase("measuring")
    progress.done, progress.failed = 120, 3
    line = progress.line()
    assert line.startswith("measuring: 120 done / 200") and "3 failed" in line and "req/s" in line
    progress.set_phase("warm-up")
    assert progress.done == 0 and progress.line().startswith("warm-up: 0 done  0 failed")


def test_off_when_stderr_is_not_a_terminal() -> None:
    progress = Progress(enabled=True, seconds=5.0)  # pytest captures stderr: not a terminal

    async def use() -> None:
        async with progress:
            progress.done += 1

    asyncio.run(use())
    assert not progress.enabled and progress.done == 1
