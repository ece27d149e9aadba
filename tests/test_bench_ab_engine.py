"""``--engine ab``: ab's report parsed into the same result, and agreeing with the built-in engine."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from models import sleep_archive
from servetune import BenchError
from servetune.bench import BenchSpec, run_bench
from servetune.bench.ab_engine import ApacheBenchEngine, parse_ab_output, parse_gnuplot

# Captured from ApacheBench 2.3 (Debian apache2-utils).
AB_REPORT = """\
Server Software:        uvicorn
Server Hostname:        127.0.0.1
Server Port:            8080

Document Path:          /predictions/sleep
Document Length:        52 bytes

Concurrency Level:      4
Time taken for tests:   2.242 seconds
Complete requests:      100
Failed requests:        7
   (Connect: 0, Receive: 0, Length: 5, Exceptions: 0)
Non-2xx responses:      2
Keep-Alive requests:    100
Total transferred:      38500 bytes
Requests per second:    44.60 [#/sec] (mean)
Time per request:       89.680 [ms] (mean)
Time per request:       22.420 [ms] (mean, across all concurrent requests)
"""
AB_GNUPLOT = """\
starttime\tseconds\tctime\tdtime\tttime\twait
Sun Nov 29 16:27:14 2026\t1795969634\t0\t11\t11\t11
Sun Nov 29 16:27:15 2026\t1795969635\t0\t21\t21\t21
"""


def test_parse_ab_report() -> None:
    figures = parse_ab_output(AB_REPORT)
    assert figures["complete"] == 100 and figures["failed"] == 7 and figures["non_2xx"] == 2
    assert figures["length"] == 5 and figures["connect"] == 0
    assert figures["seconds"] == 2.242 and figures["rps"] == 44.6 and figures["mean_ms"] == 89.68
    with pytest.raises(BenchError, match="cannot parse"):
        parse_ab_output("apr_socket_recv: Connection refused (111)")
    assert parse_gnuplot(AB_GNUPLOT) == ([1795969634.0, 1795969635.0], [11.0, 21.0])


def test_length_failures_are_answers_not_errors() -> None:
    rec = ApacheBenchEngine()._recording(AB_REPORT, 0.5, AB_GNUPLOT)
    assert dict(rec.extra_errors) == {"non-2xx": 2}
    assert any("'Length' failures" in w for w in rec.warnings)
    assert list(rec.start_s) == [0.0, 1.0] and rec.window_s == 2.242 and rec.resolution_ms == 1.0


def test_command_matches_torchserve_benchmark(tmp_path: Path) -> None:
    spec = BenchSpec(url="http://h:8080/predictions/m", concurrency=10, requests=100, timeout=300)
    body = tmp_path / "input"
    cmd = ApacheBenchEngine().command(spec, body, "application/jpg", tmp_path, warmup=False)
    # benchmark-ab.py: ab -c C -s 300 -n N -k -p INPUT -T CONTENT_TYPE URL
    assert cmd[:3] == ["ab", "-k", "-c"] and cmd[-1] == spec.url
    flags = dict(zip(cmd[1:-1:1], cmd[2:-1:1], strict=False))
    assert flags["-c"] == "10" and flags["-s"] == "300" and flags["-n"] == "100"
    assert flags["-p"] == str(body) and flags["-T"] == "application/jpg" and "-g" in cmd
    timed = BenchSpec(url=spec.url, concurrency=2, duration=5.0)
    cmd = ApacheBenchEngine().command(timed, None, None, tmp_path, warmup=False)
    assert cmd.index("-t") < cmd.index("-n") and "-p" not in cmd  # -t before -n, or ab caps at 50,000


def test_ab_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://127.0.0.1:9/predictions/m"
    if shutil.which("ab"):
        with pytest.raises(BenchError, match="closed-loop only"):
            run_bench(BenchSpec(url=url, rate=10.0, duration=1.0, engine="ab"))
        (tmp_path / "a").write_text("a")
        (tmp_path / "b").write_text("b")
        with pytest.raises(BenchError, match="sends one body"):
            run_bench(BenchSpec(url=url, requests=2, input=tmp_path, engine="ab"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BenchError, match="apt-get install apache2-utils"):
        run_bench(BenchSpec(url=url, requests=2, engine="ab"))


def test_ab_agrees_with_the_builtin_engine(start_server: Callable[..., Any], tmp_path: Path) -> None:
    if shutil.which("ab") is None:
        pytest.skip("ab (Apache Bench) is not installed: apt-get install apache2-utils")
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=20.0)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    body = tmp_path / "input.txt"
    body.write_text("hello")
    common = {
        "url": server.inference_url + "/predictions/sleep",
        "input": body,
        "concurrency": 4,
        "requests": 100,
        "warmup_requests": 8,
        "metrics_url": server.metrics_url,
    }
    ours = run_bench(BenchSpec(**common))  # type: ignore[arg-type]
    theirs = run_bench(BenchSpec(engine="ab", **common))  # type: ignore[arg-type]
    assert theirs.sent == 100 and theirs.errors == {} and theirs.latency and ours.latency
    assert theirs.throughput_rps == pytest.approx(ours.throughput_rps, rel=0.15)
    assert theirs.latency.mean_ms == pytest.approx(ours.latency.mean_ms, rel=0.15)
    assert theirs.latency.p50_ms == pytest.approx(ours.latency.p50_ms, rel=0.15)
    # ab sees no timing headers: the breakdown comes from the server's /metrics deltas, and agrees with ours.
    assert ours.server is not None and ours.server.source == "headers"
    assert theirs.server is not None and theirs.server.source == "metrics" and theirs.server.requests == 100
    assert theirs.server.handler is not None and ours.server.handler is not None
    assert theirs.server.handler.mean_ms == pytest.approx(ours.server.handler.mean_ms, rel=0.15)
    assert theirs.server.batch_size_mean == pytest.approx(1.0)
    assert theirs.client.cpu_seconds > 0.0
