"""One run from spec to result: read inputs, pick the engine, scrape metrics around the measured part, summarise."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import aiohttp

from servetune._exceptions import BenchError
from servetune.bench.engines import RunHooks, get_engine
from servetune.bench.host import HostSampler, HostUsage, listeners
from servetune.bench.metrics import Samples, metrics_breakdown, scrape
from servetune.bench.payload import load_payloads
from servetune.bench.progress import Progress
from servetune.bench.recording import Recording, summarise
from servetune.bench.result import BenchResult
from servetune.bench.spec import BenchSpec
from servetune.startup import heap_frozen

T = TypeVar("T")


async def describe_model(management_url: str, model: str, token: str | None = None) -> dict[str, str]:
    """CSV labels (batch_size, batch_delay, workers) from the management API's ``GET /models/{model}``."""
    url = f"{management_url.rstrip('/')}/models/{model}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with session.get(url, headers=headers) as response:
                if response.status != 200:
                    raise BenchError(f"management_url: GET {url} answered {response.status}")
                described: Any = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise BenchError(f"management_url: cannot read {url}: {exc}") from exc
    entry = described[0] if isinstance(described, list) and described else {}
    labels = {"model": model}
    for label, key in (("batch_size", "batchSize"), ("batch_delay", "maxBatchDelay")):
        if key in entry:
            labels[label] = str(entry[key])
    if isinstance(entry.get("workers"), list):
        labels["workers"] = str(len(entry["workers"]))
    return labels


async def run_bench_async(
    spec: BenchSpec,
    progress: Progress | None = None,
    enough: Callable[[Recording, float], bool] | None = None,
    min_seconds: float = 0.0,
) -> BenchResult:
    """Run one load run on the current event loop. Anything else busy on this loop delays the client: an open-loop
    run notices (late sends) and marks its result unreliable. ``enough``/``min_seconds``: end the measured part
    early once the figures suffice (``RunHooks``)."""
    payloads = load_payloads(spec.input, spec.content_type, spec.form_field)
    engine = get_engine(spec.engine)
    if spec.management_url and spec.model:
        described = await describe_model(spec.management_url, spec.model, spec.management_token)
        spec = dataclasses.replace(spec, labels={**described, **spec.labels})
    scrapes: dict[str, Samples] = {}
    sampler = HostSampler(spec.server_pids or listeners(spec.url), spec.contended_cores)
    host: list[HostUsage | None] = [None]

    def scraper(key: str) -> Callable[[], Awaitable[None]]:
        async def take() -> None:
            if key == "before":
                sampler.start()
            else:
                host[0] = sampler.stop()
            if spec.metrics_url:
                scrapes[key] = await scrape(spec.metrics_url)

        return take

    progress = progress or Progress()
    started = datetime.now(timezone.utc)
    async with progress:
        hooks = RunHooks(measure_start=scraper("before"), measure_end=scraper("after"), progress=progress,
                         enough=enough, min_seconds=min_seconds)  # fmt: skip
        with heap_frozen():  # a full collection of this process's heap would be measured as the server's latency
            recording: Recording = await engine.run(spec, payloads, hooks)
    breakdown = None
    if "before" in scrapes and "after" in scrapes:
        breakdown = metrics_breakdown(scrapes["before"], scrapes["after"], spec.model)
    return summarise(spec, recording, started, breakdown, host=host[0])


def run_bench(
    spec: BenchSpec,
    progress: bool = False,
    enough: Callable[[Recording, float], bool] | None = None,
    min_seconds: float = 0.0,
) -> BenchResult:
    """Run one load run and wait for it (a fresh event loop, uvloop when installed, on a thread of its own when
    the caller is inside an event loop already). ``progress`` shows a live line on stderr if it is a terminal;
    ``enough``/``min_seconds`` end the measured part early once the figures suffice (``RunHooks``)."""
    seconds = spec.duration or (spec.schedule.duration_s if spec.schedule is not None else None)
    live = Progress(enabled=progress, requests=spec.requests, seconds=seconds)
    return _run_on_fresh_loop(lambda: run_bench_async(spec, live, enough, min_seconds))


def run_together(specs: Sequence[BenchSpec]) -> list[BenchResult]:
    """Several load runs at the same time on one fresh event loop (an app's models, each loaded by its own stream);
    results in the order of ``specs``."""

    async def every() -> list[BenchResult]:
        return list(await asyncio.gather(*(run_bench_async(spec) for spec in specs)))

    return _run_on_fresh_loop(every)


def _run_on_fresh_loop(make: Callable[[], Awaitable[T]]) -> T:
    def run() -> T:
        loop: asyncio.AbstractEventLoop
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(make())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(run())
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="servetune-bench")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]
