"""The open loop's clock: every due time called back once, never early, on the precise timer and on the fallback."""

from __future__ import annotations

import asyncio
import time

import pytest

from servetune.bench.ticker import Pacer


def run_pacer(precise: bool) -> list[tuple[float, float]]:
    """200 due times 0.5 ms apart (some already past when their turn comes); returns (due, called) pairs."""

    async def main() -> list[tuple[float, float]]:
        pacer = Pacer()
        if not precise:
            pacer.close()  # the fallback: the loop's own timers, then yielding
        start = time.perf_counter() + 0.01
        dues = [start + 0.0005 * i for i in range(200)]
        calls: list[tuple[float, float]] = []
        cursor = 0

        def fire(now: float) -> float | None:
            nonlocal cursor
            while cursor < len(dues) and dues[cursor] <= now:
                calls.append((dues[cursor], time.perf_counter()))
                cursor += 1
            return dues[cursor] if cursor < len(dues) else None

        try:
            await pacer.run(dues[0], fire)
        finally:
            pacer.close()
        return calls

    return asyncio.run(main())


@pytest.mark.parametrize("precise", [True, False])
def test_each_due_time_is_called_once_and_never_early(precise: bool) -> None:
    calls = run_pacer(precise)
    assert len(calls) == 200 and [due for due, _ in calls] == sorted(due for due, _ in calls)
    assert all(called >= due for due, called in calls)
    # Punctuality is the machine's (a busy one delays everything), so it is measured by the benchmarks, not here.


def test_an_exception_in_the_callback_reaches_the_caller() -> None:
    async def main() -> None:
        pacer = Pacer()
        try:

            def fire(now: float) -> float | None:
                raise ValueError("boom")

            await pacer.run(time.perf_counter(), fire)
        finally:
            pacer.close()

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(main())
