"""The built-in engine: keep-alive connections (a lean HTTP/1.1 client, see http11.py), closed or open loop.

Closed loop: ``concurrency`` clients, each sends its next request when the previous one is answered. The warm-up is
a separate phase that drains before measurement starts.

Open loop: requests leave on a schedule fixed in advance (``BenchSpec.open_schedule``: a rate, a trace, a shape),
whatever the server does. A request's latency runs from its *intended* send time, so time spent queued behind a slow
server or a busy client counts (no coordinated omission). A precise clock (``ticker.py``: a timerfd on Linux) calls
the scheduler back when the next send is due; it starts every send that is due then (never one before its time),
and they leave on the loop's next iteration; each records when it actually left. A send more than ``LATE_MS`` after
its intended time is late: the client, not the server, delayed it (``Fidelity`` sums it up: slip percentiles and
per-second counts).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

from servetune.bench.engines import RunHooks
from servetune.bench.payload import Payload
from servetune.bench.pipeline import PipelineSender
from servetune.bench.recording import LATE_MS, Recording
from servetune.bench.sender import RequestSender, Sender
from servetune.bench.spec import BenchSpec
from servetune.bench.ticker import Pacer

CHECK_EVERY_S = 0.5  # how often RunHooks.enough is asked


class _Stop:
    """Set when the caller's ``enough`` says the measured part can end."""

    def __init__(self) -> None:
        self.set = False


async def _checker(hooks: RunHooks, rec: Recording, started: float, stop: _Stop) -> None:
    if hooks.enough is None:
        return
    while not stop.set:
        await asyncio.sleep(CHECK_EVERY_S)
        elapsed = time.perf_counter() - started
        if elapsed >= hooks.min_seconds and hooks.enough(rec, elapsed):
            stop.set = True


class AsyncEngine:
    """The default engine (``--engine async``)."""

    name = "async"

    async def run(self, spec: BenchSpec, payloads: Sequence[Payload], hooks: RunHooks) -> Recording:
        sender: PipelineSender | RequestSender = (
            PipelineSender(spec, payloads) if spec.stages else RequestSender(spec, payloads)
        )
        try:
            if spec.mode == "closed":
                rec = await self._closed(spec, sender, hooks)
            else:
                rec = await self._open(spec, sender, hooks)
        finally:
            sender.close()
        rec.warnings += sender.warnings
        return rec

    async def _closed(self, spec: BenchSpec, sender: Sender, hooks: RunHooks) -> Recording:
        issued = 0
        if spec.warmup_requests or spec.warmup_seconds:
            hooks.progress.set_phase("warm-up")
            issued = await self._closed_phase(
                spec.clients, sender, hooks, None, spec.warmup_requests or None, spec.warmup_seconds or None, 0
            )
        await hooks.measure_start()
        hooks.progress.set_phase("measuring")
        rec = Recording()
        stop = _Stop()
        checker = asyncio.ensure_future(_checker(hooks, rec, time.perf_counter(), stop))
        try:
            await self._closed_phase(spec.clients, sender, hooks, rec, spec.requests, spec.duration, issued, stop)
        finally:
            stop.set = True
            checker.cancel()
        await hooks.measure_end()
        return rec

    async def _closed_phase(
        self,
        clients: int,
        sender: Sender,
        hooks: RunHooks,
        rec: Recording | None,
        requests: int | None,
        seconds: float | None,
        first: int,
        stop: _Stop | None = None,
    ) -> int:
        """Run ``clients`` request loops; return the index of the next request (payloads keep cycling)."""
        progress = hooks.progress
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        deadline = t0 + seconds if seconds else math.inf
        limit = first + requests if requests else math.inf
        issued = first
        last_end = t0
        halt = stop or _Stop()

        async def client() -> None:
            nonlocal issued, last_end
            clock = time.perf_counter
            while issued < limit and clock() < deadline and not halt.set:
                i = issued
                issued += 1
                start = clock()
                status, queue, handler, batch, calls = await sender.send(i)
                end = clock()
                last_end = max(last_end, end)
                progress.done += 1
                if not 200 <= status < 300:
                    progress.failed += 1
                if rec is not None:
                    rec.add(start - t0, (end - start) * 1e3, status, queue, handler, batch, calls)

        await asyncio.gather(*(client() for _ in range(clients)))
        if rec is not None:
            rec.window_s = last_end - t0
            rec.cpu_seconds = time.thread_time() - cpu0
            rec.peak_in_flight = clients
        return issued

    async def _open(self, spec: BenchSpec, sender: Sender, hooks: RunHooks) -> Recording:
        schedule = spec.open_schedule()
        offsets: list[float] = schedule.offsets_s.tolist()
        early = False
        rec = Recording()
        progress = hooks.progress
        progress.set_phase("warm-up" if spec.warmup_requests or spec.warmup_seconds else "measuring")
        clock = time.perf_counter
        tasks: set[asyncio.Task[None]] = set()
        in_flight = 0
        late_s = LATE_MS / 1e3
        stop = _Stop()
        checker: asyncio.Future[None] | None = None
        t0 = clock() + 0.002
        m0 = math.inf  # absolute intended time of the first measured send
        m_offset = 0.0  # and its offset in the schedule
        first_measured = -1
        last_end = t0
        cpu0 = time.thread_time()

        async def timed(i: int, intended: float, measured: bool) -> None:
            nonlocal in_flight, last_end
            start = clock()
            in_flight += 1
            if measured:
                rec.peak_in_flight = max(rec.peak_in_flight, in_flight)
                late = start - intended
                if late > late_s:
                    rec.late_sends += 1
                    rec.max_late_ms = max(rec.max_late_ms, late * 1e3)
            status, queue, handler, batch, calls = await sender.send(i)
            end = clock()
            in_flight -= 1
            progress.done += 1
            if not 200 <= status < 300:
                progress.failed += 1
            if measured:
                last_end = max(last_end, end)
                calls = tuple((c[0], c[1] + start - intended, *c[2:]) for c in calls)  # from the intended start
                rec.add(intended - m0, (end - min(intended, start)) * 1e3, status, queue, handler, batch, calls,
                        start - m0)  # fmt: skip

        count = len(offsets)
        cursor = 0

        def fire(now: float) -> float | None:
            """Start every send due by ``now``; return when the next one is due (None: the schedule is over)."""
            nonlocal cursor, first_measured, m0, m_offset, cpu0, checker
            i = cursor
            while i < count and t0 + offsets[i] <= now:
                if stop.set:
                    return None
                offset = offsets[i]
                measured = i >= spec.warmup_requests and offset >= spec.warmup_seconds
                if measured:
                    if first_measured < 0:
                        first_measured, m0, m_offset = i, t0 + offset, offset
                        progress.set_phase("measuring")
                        cpu0 = time.thread_time()
                        tasks.add(asyncio.ensure_future(hooks.measure_start()))
                        checker = asyncio.ensure_future(_checker(hooks, rec, now, stop))
                    if (spec.requests and i - first_measured >= spec.requests) or (
                        spec.duration and offset - m_offset >= spec.duration - 1e-9
                    ):
                        cursor = count
                        return None
                    rec.scheduled += 1
                task = asyncio.create_task(timed(i, t0 + offset, measured))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
            cursor = i
            return None if i >= count or stop.set else t0 + offsets[i]

        pacer = Pacer()
        try:
            if count:
                await pacer.run(t0 + offsets[0], fire)
            early = stop.set
            await asyncio.gather(*tasks)
        finally:
            pacer.close()
            stop.set = True
            if checker is not None:
                checker.cancel()
        # The measured window: to the end of the schedule's measured part (a trace may end after its last send), or
        # to the last answer when that came later; to the last answer only, when the caller ended it early.
        duration = 0.0 if early else spec.duration or max(0.0, schedule.duration_s - m_offset)
        rec.window_s = max(last_end, m0 + duration) - m0 if rec.scheduled else 0.0
        rec.cpu_seconds = time.thread_time() - cpu0
        if rec.peak_in_flight >= spec.max_connections:
            rec.warnings.append(
                f"{spec.max_connections} connections were all busy at times: later requests waited in the client "
                "(the wait is counted in their latency)"
            )
        await hooks.measure_end()
        return rec
