"""The built-in engine against a real servetune server whose model has a known cost (sleep 20 ms per batch)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from models import sleep_archive
from servetune.bench import BenchResult, BenchSpec, run_bench, run_bench_async
from servetune.bench.metrics import parse_prometheus
from servetune.bench.runner import _run_on_fresh_loop

COST_MS = 20.0  # the model sleeps this long per batch; batch size 1, one worker: capacity 50 req/s


def sleep_server(start_server: Callable[..., Any], tmp_path: Path, **properties: str) -> Any:
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=COST_MS)
    return start_server(model_store=store, models={"sleep": "sleep.mar"}, properties=properties)


def ts_counter(metrics_url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as response:
        samples = parse_prometheus(response.read().decode())
    return sum(samples.get(name, {}).values())


def test_closed_loop_matches_the_known_cost(start_server: Callable[..., Any], tmp_path: Path) -> None:
    server = sleep_server(start_server, tmp_path)
    url = server.inference_url + "/predictions/sleep"
    one = run_bench(BenchSpec(url=url, concurrency=1, requests=60, warmup_requests=5))
    assert one.sent == 60 and one.errors == {} and one.latency is not None
    # One client: each request costs the handler's 20 ms plus transport; nothing queues.
    # The client's P50 minus the server's handler P50 is transport + frontend: ~1 ms on a quiet machine; the bound
    # is loose for shared CI machines, yet catches a ~40 ms delayed-ACK stall (TCP_NODELAY missing) on keep-alive.
    assert one.server is not None and one.server.handler is not None
    assert COST_MS <= one.latency.p50_ms <= one.server.handler.p50_ms + 30, (
        f"P50 {one.latency.p50_ms:.1f} ms for a {COST_MS} ms handler: time lost between the handler and the client "
        f"(server breakdown: {one.server})"
    )
    # Little's law for a closed loop: throughput = clients / mean latency.
    assert one.throughput_rps == pytest.approx(1000.0 / one.latency.mean_ms, rel=0.1)
    assert one.server is not None and one.server.source == "headers" and one.server.handler is not None
    assert one.server.handler.mean_ms == pytest.approx(COST_MS, abs=5.0)
    assert one.server.batch_size_mean == 1.0

    four = run_bench(BenchSpec(url=url, concurrency=4, requests=100))
    assert four.latency is not None and four.server is not None and four.server.queue is not None
    # Four clients saturate the single worker: throughput at capacity, and each waits for the three others.
    assert four.throughput_rps == pytest.approx(1000.0 / COST_MS, rel=0.25)
    assert four.latency.mean_ms == pytest.approx(4 * 1000.0 / four.throughput_rps, rel=0.15)
    assert four.server.queue.mean_ms > 1.5 * COST_MS


def test_coordinated_omission_open_loop_sees_the_queue(start_server: Callable[..., Any], tmp_path: Path) -> None:
    server = sleep_server(start_server, tmp_path)
    url = server.inference_url + "/predictions/sleep"
    closed = run_bench(BenchSpec(url=url, concurrency=1, duration=2.0))
    below = run_bench(BenchSpec(url=url, rate=25.0, duration=2.0))  # half the capacity
    above = run_bench(BenchSpec(url=url, rate=75.0, duration=2.0))  # 1.5 x the capacity
    assert closed.latency and below.latency and above.latency
    # The closed loop keeps the server busy, yet its tail stays at one service time: it only sends when answered.
    assert closed.latency.p99_ms < 5 * COST_MS
    # Offered 75 req/s for 2 s against 50 req/s: >= 50 requests queue up, the last ones wait >= 1 s.
    assert above.sent == 150 and above.throughput_rps < 1000.0 / COST_MS * 1.1
    assert above.latency.p99_ms > 500.0
    assert above.latency.p99_ms > 5 * closed.latency.p99_ms
    assert below.latency.p99_ms < 0.3 * above.latency.p99_ms
    # No request can take less than the handler's sleep (an early start is timed from when it really left).
    assert min(closed.latency.min_ms, below.latency.min_ms, above.latency.min_ms) >= COST_MS
    # And the server's own queue time agrees that the wait was in its queue.
    assert above.server is not None and above.server.queue is not None and above.server.queue.p99_ms is not None
    assert above.server.queue.p99_ms > 400.0


def test_errors_are_counted_by_status(start_server: Callable[..., Any], tmp_path: Path) -> None:
    server = sleep_server(start_server, tmp_path, job_queue_size="1")
    url = server.inference_url + "/predictions/sleep"
    before_5xx = ts_counter(server.metrics_url, "Requests5XX")
    before_2xx = ts_counter(server.metrics_url, "Requests2XX")
    full = run_bench(BenchSpec(url=url, concurrency=6, requests=60))
    assert set(full.errors) == {"503"} and full.errors["503"] > 0
    assert full.succeeded + full.errors["503"] == full.sent == 60
    # The server counted the same answers.
    assert ts_counter(server.metrics_url, "Requests5XX") - before_5xx == full.errors["503"]
    assert ts_counter(server.metrics_url, "Requests2XX") - before_2xx == full.succeeded
    assert full.error_rate == pytest.approx(full.errors["503"] / 60)

    missing = run_bench(BenchSpec(url=server.inference_url + "/predictions/nope", concurrency=2, requests=10))
    assert missing.errors == {"404": 10} and missing.succeeded == 0 and missing.latency is None

    refused = run_bench(BenchSpec(url="http://127.0.0.1:9/predictions/x", concurrency=1, requests=3, timeout=5))
    assert refused.errors == {"connection": 3}


def test_warmup_is_sent_but_excluded(start_server: Callable[..., Any], tmp_path: Path) -> None:
    server = sleep_server(start_server, tmp_path)
    url = server.inference_url + "/predictions/sleep"
    before = ts_counter(server.metrics_url, "ts_inference_requests_total")
    closed = run_bench(BenchSpec(url=url, concurrency=2, requests=20, warmup_requests=6))
    middle = ts_counter(server.metrics_url, "ts_inference_requests_total")
    opened = run_bench(BenchSpec(url=url, rate=20.0, duration=1.0, warmup_seconds=0.5))
    after = ts_counter(server.metrics_url, "ts_inference_requests_total")
    assert closed.sent == 20 and middle - before == 26
    assert opened.sent == 20 and after - middle == 30
    assert opened.samples is not None and min(opened.samples.start_s) == 0.0
    # Constant arrivals: the measured sends were scheduled exactly 50 ms apart.
    gaps = [b - a for a, b in zip(opened.samples.start_s, opened.samples.start_s[1:], strict=False)]
    assert gaps == pytest.approx([0.05] * 19)


def test_late_sends_are_detected(start_server: Callable[..., Any], tmp_path: Path) -> None:
    server = start_server()
    ping = server.inference_url + "/ping"

    async def with_blocked_loop() -> BenchResult:
        async def blocker() -> None:
            while True:
                await asyncio.sleep(0.05)
                time.sleep(0.025)  # something else hogs the client's event loop

        task = asyncio.create_task(blocker())
        try:
            return await run_bench_async(BenchSpec(url=ping, method="GET", rate=200.0, duration=1.0))
        finally:
            task.cancel()

    blocked = _run_on_fresh_loop(with_blocked_loop)
    assert blocked.unreliable and "fell behind its schedule" in blocked.reasons[0]
    assert blocked.late_sends > 0.2 * blocked.sent and blocked.max_late_ms > 10.0

    # A rate no Python client can keep up with: 2,000 sends in 2 ms, 1 us apart (starting an asyncio task alone takes
    # several). At 50,000/s a fast machine kept within 1 ms of the schedule.
    flood = run_bench(BenchSpec(url=ping, method="GET", rate=1_000_000.0, duration=0.002, max_connections=32))
    assert flood.sent == 2000 and flood.unreliable and flood.late_sends > 0.5 * flood.sent


def test_run_bench_from_inside_an_event_loop(start_server: Callable[..., Any]) -> None:
    server = start_server()

    async def caller() -> BenchResult:
        return run_bench(BenchSpec(url=server.inference_url + "/ping", method="GET", concurrency=2, requests=10))

    result = asyncio.run(caller())
    assert result.succeeded == 10
