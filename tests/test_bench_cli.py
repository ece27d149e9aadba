"""``servetune bench``: the command line over a real server, its files, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from models import sleep_archive
from servetune.cli import cli


def test_bench_command_writes_reports(start_server: Callable[..., Any], tmp_path: Path) -> None:
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=5.0)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    image = tmp_path / "drawing.png"
    image.write_bytes(b"\x89PNG fake")
    out = tmp_path / "report"
    url = server.inference_url + "/predictions/sleep"
    args = ["bench", url, "--input", str(image), "--form-field", "data", "-c", "2", "-n", "40", "--warmup", "4",
            "--management-url", server.management_url, "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "throughput" in result.output and "P99 / P99.9" in result.output and f"wrote {out}" in result.output
    data = json.loads((out / "result.json").read_text())
    assert data["sent"] == 40 and data["errors"] == {} and data["mode"] == "closed"
    # --management-url filled the deployment columns from GET /models/sleep
    assert data["labels"] == {"model": "sleep", "batch_size": "1", "batch_delay": "100", "workers": "1"}
    header = (out / "ab_report.csv").read_text().splitlines()[0]
    assert header.startswith("Benchmark,TS failed requests,TS throughput,TS latency P50")
    assert (out / "latency.png").exists() and (out / "report.md").read_text().startswith("# Load run")


def test_bench_command_json_and_open_loop(start_server: Callable[..., Any]) -> None:
    server = start_server()
    args = ["bench", server.inference_url + "/ping", "--method", "GET", "--rate", "50", "--duration", "0.5",
            "--arrival", "poisson", "--label", "variant=eager", "--json"]  # fmt: skip
    result = CliRunner(mix_stderr=False).invoke(cli, args) if _mix_stderr_supported() else CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["mode"] == "open" and data["arrival"] == "poisson" and data["rate"] == 50.0
    assert data["labels"] == {"variant": "eager"} and data["succeeded"] == data["sent"] > 0


def test_bad_arguments_exit_2_with_the_key_named(tmp_path: Path) -> None:
    for args, named in (
        (["--warmup", "soon"], "warmup='soon'"),
        (["--rate", "10", "--concurrency", "2"], "give one"),
        (["--header", "no-colon"], "--header='no-colon'"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "servetune", "bench", "http://127.0.0.1:9/predictions/m", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert named in proc.stderr


def _mix_stderr_supported() -> bool:
    import inspect

    return "mix_stderr" in inspect.signature(CliRunner).parameters
