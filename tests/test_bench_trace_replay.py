"""Trace replay against a real server whose model has a known cost: goodput and attainment computed by hand, the
files a run writes, shape mode, and a run ended early once its figures suffice. One server for the whole file."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import RunningServer
from models import sleep_archive
from servetune.bench import BenchSpec, run_bench
from servetune.bench.fit import fit, measure_capacity
from servetune.bench.schedule import Schedule
from servetune.bench.slo import Slo
from servetune.bench.traces import read_trace
from servetune.cli import cli

COST_MS = 5.0  # one worker, batch 1: the model sleeps 5 ms a request; a body "sleep:S" sleeps S seconds more
SLOW_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("store")
    sleep_archive(store, batch_ms=COST_MS)
    props = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
    running = RunningServer(store, {"sleep": "sleep.mar"}, props, workdir=tmp_path_factory.mktemp("server"),
                            startup_timeout=120.0, fail_on_model_error=False)  # fmt: skip
    running.start()
    run_bench(BenchSpec(url=running.inference_url + "/predictions/sleep", concurrency=1, requests=5))  # warm
    yield running
    running.stop()


def url(server: RunningServer) -> str:
    return server.inference_url + "/predictions/sleep"


def test_goodput_attainment_and_windows_by_hand(server: RunningServer, tmp_path: Path) -> None:
    # Twenty request bodies sent in turn: request i is slow (5 ms + 1 s) when i % 20 == 19, else fast (5 ms).
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for j in range(20):
        (inputs / f"{j:02d}.bin").write_text(f"sleep:{SLOW_S}" if j == 19 else "fast")
    # The trace (ms), in 0.5 s windows:
    #   [0, 0.5)   requests 0-9, fast, 50 ms apart: all answered in ~5 ms          10 good  -> inside
    #   [0.5, 1)   requests 10-18 fast, then 19 (slow) at 950 ms: 1005 ms         9 good   -> outside (90% < 95%)
    #   [1, 1.5)   requests 20-24 at 1000-1040 ms, queued behind 19 (one worker) until ~1955 ms: each waits
    #              over 900 ms                                                     0 good   -> outside
    #   [2.5, 3)   requests 25-34, fast, 50 ms apart, the queue long drained         10 good  -> inside
    times = [i * 50 for i in range(20)] + [1000 + 10 * k for k in range(5)] + [2500 + 50 * k for k in range(10)]
    (tmp_path / "trace.csv").write_text("t_ms\n" + "\n".join(str(t) for t in times) + "\n")
    slo = Slo(p95_ms=400.0)  # a good request is answered within 400 ms (a fast one takes ~5 ms, a slow one 1 s)
    result = run_bench(BenchSpec(url=url(server), input=inputs, schedule=read_trace(tmp_path / "trace.csv"),
                                 slo=slo, window_s=0.5))  # fmt: skip
    assert result.sent == 35 and result.errors == {} and result.slo is not None, result.errors
    figures, rec = result.slo, result.samples
    assert rec is not None
    slow = sorted((t, round(lat), h, q) for t, lat, h, q in zip(rec.start_s, rec.latency_ms, rec.handler_ms,
                                                                rec.queue_ms, strict=True) if lat > 400)  # fmt: skip
    assert (figures.sent, figures.good) == (35, 29), (slow, result.host)
    assert figures.attainment == pytest.approx(29 / 35)
    # The measured window runs from the first intended send to the last answer (2.95 s + ~5 ms).
    assert 2.95 <= result.duration_s < 2.95 + 0.3
    assert figures.goodput_rps == pytest.approx(29 / result.duration_s)
    windows = [(w.start_s, w.sent, w.good, w.inside) for w in figures.windows]
    assert windows == [(0.0, 10, 10, True), (0.5, 10, 9, False), (1.0, 5, 0, False), (2.5, 10, 10, True)]
    assert figures.windows_share == 0.5
    # Latency is timed from the intended send: the queued requests waited for the slow one, sent 950 ms in.
    queued = [lat for t, lat in zip(rec.start_s, rec.latency_ms, strict=True) if 1.0 <= t < 1.5]
    assert min(queued) >= 950 + 1000 * SLOW_S - 1040 - 5
    assert result.fidelity is not None and result.fidelity.seconds == 2 and result.host is not None


def test_bench_trace_command_writes_every_request(server: RunningServer, tmp_path: Path) -> None:
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps({"t_ms": i * 25, "size": i}) + "\n" for i in range(40)))
    out = tmp_path / "out"
    args = ["bench", url(server), "--trace", str(tmp_path / "trace.jsonl"), "--rate-scale", "1", "--slo", "p99_ms=200",
            "--window", "0.5", "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "attainment" in result.output and "goodput" in result.output and "schedule kept" in result.output
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 40 and lines[0]["intended_s"] == 0.0 and lines[-1]["intended_s"] == pytest.approx(0.975)
    assert all(x["status"] == 200 and x["batch_size"] == 1 and x["handler_ms"] >= COST_MS for x in lines)
    assert all(x["sent_s"] >= x["intended_s"] - 0.001 for x in lines)
    data = json.loads((out / "result.json").read_text())
    assert data["slo"]["sent"] == 40 and data["slo"]["good"] == sum(x["latency_ms"] <= 200 for x in lines)
    assert data["schedule"].startswith("trace.jsonl (jsonl)") and data["mode"] == "open"
    assert data["fidelity"]["seconds"] == 1 and "others_cores" in data["host"]
    assert (out / "windows.csv").read_text().splitlines()[0] == "start_s,sent,succeeded,good,p99_ms,inside_slo"
    assert len((out / "windows.csv").read_text().splitlines()) == 3
    bad = CliRunner().invoke(cli, ["bench", url(server), "--trace", str(tmp_path / "trace.jsonl"), "--rate", "5"])
    assert bad.exit_code != 0 and "a trace says when each request leaves" in str(bad.exception or bad.output)


def test_shape_mode_scales_the_peak_to_a_share_of_the_capacity(server: RunningServer) -> None:
    spec = BenchSpec(url=url(server), concurrency=1, duration=1.0)
    capacity = measure_capacity(spec, seconds=0.6, max_concurrency=4)
    # One worker at 5 ms a request: at most 200 req/s (less the server's own time per request).
    assert 40.0 <= capacity.rps <= 205.0 and capacity.concurrency in (1, 2, 4)
    trace = Schedule.steady(10.0, seconds=3.0).then(Schedule.steady(40.0, seconds=3.0))
    shaped = fit(trace, capacity.rps, 0.5, seed=1)
    assert shaped.peak_rps(1.0) == pytest.approx(0.5 * capacity.rps, rel=0.25)
    assert "shape mode" in shaped.notes[0]


def test_a_run_ends_early_once_its_figures_suffice(server: RunningServer) -> None:
    spec = BenchSpec(url=url(server), concurrency=2, duration=30.0)
    started = time.monotonic()
    result = run_bench(spec, enough=lambda rec, seconds: len(rec.latency_ms) >= 20, min_seconds=0.3)
    assert time.monotonic() - started < 10.0 and 20 <= result.sent < 200
    assert result.throughput_rps == pytest.approx(result.succeeded / result.duration_s)
    opened = run_bench(dataclasses_replace(spec, rate=40.0), enough=lambda rec, s: s >= 0.5, min_seconds=0.5)
    assert 10 <= opened.sent <= 80 and opened.duration_s < 5.0


def dataclasses_replace(spec: BenchSpec, rate: float) -> BenchSpec:
    import dataclasses

    return dataclasses.replace(spec, concurrency=None, rate=rate)
