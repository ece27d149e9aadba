"""The load generator's own ceiling: requests/s per client core on a no-op endpoint, against aiohttp, ab and wrk.

    python benchmarks/bench_ceiling.py [--seconds 5] [--concurrency 16] [--rate 2000]

A no-op HTTP/1.1 server (raw asyncio protocol, uvloop when installed, its own process) answers every request with
"OK", so the server is as cheap as it can be. Each tool runs against it in turn (aiohttp's client is there
because the engine used it before its own lean client; it shows why the change); the figure that matters is
requests per second of *client CPU time* (the tool's own CPU, not the server's), so the ratio holds even when the
server, sharing the machine, is what limits the raw rate. Then an open-loop run at --rate checks that the
built-in engine keeps its schedule (late sends) and is not the bottleneck below that rate; a bare scheduler (the
same timer loop sending nothing) runs at the same rate as a baseline, so late sends the machine itself causes
(a busy or virtualised CPU waking the process late) are not blamed on the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from servetune.bench import BenchSpec, run_bench
from servetune.bench.recording import LATE_MS
from servetune.bench.schedule import Schedule
from servetune.bench.ticker import Pacer

_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\n\r\nOK"


class _NoOp(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            match = re.search(rb"content-length:\s*(\d+)", head)
            size = end + 4 + (int(match.group(1)) if match else 0)
            if len(self.buffer) < size:
                return
            self.buffer = self.buffer[size:]
            self.transport.write(_RESPONSE)


def serve(port: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_NoOp, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def scheduled(rate: float, seconds: float, start: Callable[[float], Coroutine[Any, Any, None]]) -> list[Any]:
    """The engine's open-loop scheduler (a precise clock calls back when a send is due; every due send is started):
    ``start(intended)`` for each send of ``rate`` req/s over ``seconds``; returns the tasks."""
    clock = time.perf_counter
    offsets = Schedule.steady(rate, seconds=seconds).offsets_s.tolist()
    tasks = []
    t0 = clock() + 0.002
    cursor = 0

    def fire(now: float) -> float | None:
        nonlocal cursor
        while cursor < len(offsets) and t0 + offsets[cursor] <= now:
            tasks.append(asyncio.ensure_future(start(t0 + offsets[cursor])))
            cursor += 1
        return t0 + offsets[cursor] if cursor < len(offsets) else None

    pacer = Pacer()
    try:
        await pacer.run(t0, fire)
    finally:
        pacer.close()
    return tasks


def bare_scheduler(rate: float, seconds: float) -> tuple[int, int]:
    """The open loop's timer loop with empty tasks: (late sends, sends) on this machine, at this rate."""
    loop = _new_loop()
    late = 0

    async def main() -> int:
        clock = time.perf_counter

        async def task(intended: float) -> None:
            nonlocal late
            late += clock() - intended > LATE_MS / 1e3

        tasks = await scheduled(rate, seconds, task)
        await asyncio.gather(*tasks)
        return len(tasks)

    try:
        sent = loop.run_until_complete(main())
    finally:
        loop.close()
    return late, sent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_child(cmd: list[str]) -> tuple[str, float, float]:
    """Run a tool; return its stdout, wall seconds and its own CPU seconds (from wait4's rusage)."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {text[-500:]}")
    return text, wall, usage.ru_utime + usage.ru_stime


def bench_ab(url: str, body: Path, concurrency: int, requests: int) -> tuple[float, float]:
    cmd = ["ab", "-q", "-k", "-c", str(concurrency), "-n", str(requests), "-p", str(body), "-T", "text/plain", url]
    text, wall, cpu = run_child(cmd)
    rate = float(re.search(r"Requests per second:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    return rate, requests / cpu


def bench_wrk(url: str, body: Path, concurrency: int, seconds: float) -> tuple[float, float]:
    script = body.with_suffix(".lua")
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = "{body.read_text().strip()}"\nwrk.headers["Content-Type"] = "text/plain"\n'
    )
    text, wall, cpu = run_child(["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "-s", str(script), url])
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    count = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
    return rate, count / cpu


async def _aiohttp_run(url: str, body: bytes, seconds: float, concurrency: int, rate: float | None) -> tuple[int, int]:
    """aiohttp's client doing the engine's job (closed loop, or the same open-loop scheduler): (sent, late)."""
    import aiohttp

    clock = time.perf_counter
    sent = late = 0
    headers = {"Content-Type": "text/plain"}
    connector = aiohttp.TCPConnector(limit=concurrency if rate is None else 1024)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:

        async def one(intended: float) -> None:
            nonlocal sent, late
            late += clock() - intended > LATE_MS / 1e3
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
            sent += 1

        end = clock() + seconds
        if rate is None:

            async def client() -> None:
                while clock() < end:
                    await one(math.inf)

            await asyncio.gather(*(client() for _ in range(concurrency)))
            return sent, 0
        await asyncio.gather(*await scheduled(rate, seconds, one))
    return sent, late


def bench_aiohttp(
    url: str, body: Path, seconds: float, concurrency: int, rate: float | None
) -> tuple[float, float, int]:
    """(req/s, req/s per client core, late sends) for aiohttp's client on a fresh (uv)loop."""
    loop = _new_loop()
    try:
        start, cpu = time.perf_counter(), time.thread_time()
        sent, late = loop.run_until_complete(_aiohttp_run(url, body.read_bytes(), seconds, concurrency, rate))
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    finally:
        loop.close()
    return sent / wall, sent / cpu, late


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each run")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop connections")
    parser.add_argument("--rate", type=float, default=2000.0, help="open-loop rate to check the schedule at")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}/predictions/noop"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    closed_rows: list[tuple[str, float, float]] = []
    open_rows: list[tuple[str, float, float, int, int]] = []
    try:
        _wait_for(port)
        with tempfile.TemporaryDirectory() as tmp:
            body = Path(tmp) / "body.txt"
            body.write_text("hello")
            c, seconds = args.concurrency, args.seconds
            closed = run_bench(BenchSpec(url=url, input=body, concurrency=c, duration=seconds, warmup_seconds=0.5))
            closed_rows.append(("servetune", closed.throughput_rps, closed.sent / closed.client.cpu_seconds))
            rate, per_core, _ = bench_aiohttp(url, body, seconds, c, None)
            closed_rows.append(("aiohttp client (reference)", rate, per_core))
            requests = max(1000, int(closed.throughput_rps * seconds))
            if shutil.which("ab"):
                closed_rows.append(("ab -k", *bench_ab(url, body, c, requests)))
            if shutil.which("wrk"):
                closed_rows.append(("wrk -t1", *bench_wrk(url, body, c, seconds)))

            opened = run_bench(BenchSpec(url=url, input=body, rate=args.rate, duration=seconds, warmup_seconds=0.5))
            sent = opened.sent
            open_rows.append(("servetune", opened.throughput_rps, sent / opened.client.cpu_seconds,
                              opened.late_sends, sent))  # fmt: skip
            rate, per_core, late = bench_aiohttp(url, body, seconds, c, args.rate)
            open_rows.append(("aiohttp client (reference)", rate, per_core, late, int(args.rate * seconds)))
            bare_late, bare_sent = bare_scheduler(args.rate, seconds)
            open_rows.append(("bare scheduler (sends nothing)", math.nan, math.nan, bare_late, bare_sent))
    finally:
        server.terminate()
        server.wait()
    ours = closed_rows[0][2]
    print(f"no-op endpoint on this machine ({os.cpu_count()} cores shared by server and client)")
    print(f"\nclosed loop, concurrency {args.concurrency}")
    print(f"{'tool':32} {'req/s':>9} {'req/s per client core':>22} {'vs servetune':>13}")
    for name, rate, per_core in closed_rows:
        print(f"{name:32} {rate:9.0f} {per_core:22.0f} {per_core / ours:12.2f}x")
    print(f"\nopen loop at {args.rate:g} req/s")
    print(f"{'tool':32} {'req/s':>9} {'req/s per client core':>22} {'late sends (> 1 ms)':>20}")
    for name, rate, per_core, late, total in open_rows:
        figures = "" if math.isnan(rate) else f"{rate:9.0f} {per_core:22.0f}"
        print(f"{name:32} {figures:>32} {f'{late}/{total} ({100 * late / total:.1f}%)':>20}")
    print(f"\nservetune at {args.rate:g} req/s: client CPU {opened.client.cpu_percent:.0f}% of one core;",
          "UNRELIABLE: " + "; ".join(opened.reasons) if opened.unreliable else "reliable")  # fmt: skip


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("no-op server did not start")


if __name__ == "__main__":
    main()
