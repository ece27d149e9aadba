"""The built-in engine: keep-alive connections (a lean HTTP/1.1 client, see http11.py), closed or open loop.

Closed loop: ``concurrency`` clients, each sends its next request when the previous one is answered. The warm-up is
a separate phase that drains before measurement starts.

Open loop: requests leave on a schedule fixed in advance, whatever the server does. A request's latency runs from
its *intended* send time, so time spent queued behind a slow server or a busy client counts (no coordinated
omission). Timers wake up to 1 ms late (epoll's resolution), and an idle process may wait a few ms more for a CPU,
so the scheduler wakes a little ahead (a quarter of the gap to the next send, between 1 and 5 ms) and a request that
starts early is timed from its actual start. A request that starts more than ``LATE_MS`` after its intended time
is late: the client, not the server, delayed it.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator, Sequence

from servetune.bench.engines import RunHooks
from servetune.bench.payload import Payload
from servetune.bench.pipeline import PipelineSender
from servetune.bench.recording import LATE_MS, Recording
from servetune.bench.sender import RequestSender, Sender
from servetune.bench.spec import BenchSpec

_EARLY_MIN, _EARLY_MAX = 0.001, 0.005


def arrivals(rate: float, arrival: str, seed: int = 0) -> Iterator[float]:
    """Send offsets in seconds from the start: every 1/rate, or a Poisson process of that rate (seeded)."""
    if arrival == "constant":
        k = 0
        while True:
            yield k / rate
            k += 1
    rng = random.Random(seed)
    offset = 0.0
    while True:
        yield offset
        offset += rng.expovariate(rate)


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
        await self._closed_phase(spec.clients, sender, hooks, rec, spec.requests, spec.duration, issued)
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
    ) -> int:
        """Run ``clients`` request loops; return the index of the next request (payloads keep cycling)."""
        progress = hooks.progress
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        deadline = t0 + seconds if seconds else math.inf
        limit = first + requests if requests else math.inf
        issued = first
        last_end = t0

        async def client() -> None:
            nonlocal issued, last_end
            clock = time.perf_counter
            while issued < limit and clock() < deadline:
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
        assert spec.rate is not None
        rec = Recording()
        progress = hooks.progress
        progress.set_phase("warm-up" if spec.warmup_requests or spec.warmup_seconds else "measuring")
        clock = time.perf_counter
        tasks: set[asyncio.Task[None]] = set()
        in_flight = 0
        late_s = LATE_MS / 1e3
        t0 = clock() + 0.002
        m0 = math.inf  # absolute intended time of the first measured send
        m_offset = 0.0  # and its offset in the schedule
        first_measured = -1
        last_end = t0
        previous = t0
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
                rec.add(intended - m0, (end - min(intended, start)) * 1e3, status, queue, handler, batch, calls)

        for i, offset in enumerate(arrivals(spec.rate, spec.arrival, spec.seed)):
            intended = t0 + offset
            measured = i >= spec.warmup_requests and offset >= spec.warmup_seconds
            if measured:
                if first_measured < 0:
                    first_measured, m0, m_offset = i, intended, offset
                    progress.set_phase("measuring")
                    cpu0 = time.thread_time()
                    tasks.add(asyncio.ensure_future(hooks.measure_start()))
                if (spec.requests and i - first_measured >= spec.requests) or (
                    spec.duration and offset - m_offset >= spec.duration - 1e-9
                ):
                    break
                rec.scheduled += 1
            # Always yield, so that started tasks run before the next send is due.
            early = min(_EARLY_MAX, max(_EARLY_MIN, (intended - previous) / 4))
            previous = intended
            await asyncio.sleep(max(0.0, intended - early - clock()))
            task = asyncio.create_task(timed(i, intended, measured))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        rec.window_s = max(last_end, m0 + (spec.duration or 0.0)) - m0 if rec.scheduled else 0.0
        rec.cpu_seconds = time.thread_time() - cpu0
        if rec.peak_in_flight >= spec.max_connections:
            rec.warnings.append(
                f"{spec.max_connections} connections were all busy at times: later requests waited in the client "
                "(the wait is counted in their latency)"
            )
        await hooks.measure_end()
        return rec
