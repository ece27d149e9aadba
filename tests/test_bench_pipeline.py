"""Pipelines in the bench layer: an app's calls driven one after the other, on a real server with two models whose
cost is known (``tune_models.py``), each on its own core (slot): A costs 100 ms per call, B 50 ms, batch 1, one
worker each. Figures are compared with what they must be by hand; the tolerances cover the serving overhead
(a few ms a call) and a busy machine, not a wrong model of the pipeline.

By hand:
- one client: nothing queues; a pipeline takes A + B = 150 ms;
- two clients (closed loop): A is the bottleneck and is never idle; a client back from B finds A busy with the
  other client for A - B = 50 ms more, so a pipeline takes 50 + 100 + 50 = 200 ms = 2 A, at 1 / A = 10 pipelines/s;
- open loop at 4 pipelines/s (one every 250 ms > A): nothing queues, 150 ms, timed from each intended start.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from servetune._exceptions import ConfigError
from servetune.bench import BenchResult, BenchSpec, StageSpec, parse_stages, run_bench
from servetune.bench.hooks import crop_top_box, load_hook, top_box
from tune_models import cost_archive

A_MS, B_MS = 100.0, 50.0
STAGES = (StageSpec("a", "input"), StageSpec("b", "answer"))

pytestmark = pytest.mark.slow  # about 25 s: a real server and timed load runs


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pipeline")
    cost_archive(folder / "store", folder / "locks-a", a_ms=A_MS - 20, b_ms=20, slots=1, name="a")
    cost_archive(folder / "store", folder / "locks-b", a_ms=B_MS - 20, b_ms=20, slots=1, name="b")
    return folder / "store"


@pytest.fixture(scope="module")
def server(store: Path) -> Any:
    from servetune.embedded import EmbeddedServer

    props = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
    with EmbeddedServer(store, {"a": "a.mar", "b": "b.mar"}, props) as running:
        yield running


def pipeline(server: Any, **load: Any) -> BenchResult:
    return run_bench(BenchSpec(url=server.inference_url, stages=STAGES, warmup_requests=2, **load))


def test_one_client_waits_for_the_sum_of_the_stages(server: Any) -> None:
    result = pipeline(server, concurrency=1, requests=12)
    assert result.failed == 0 and result.latency is not None and set(result.stages) == {"a", "b"}
    a, b = result.stages["a"], result.stages["b"]
    assert a.sent == b.sent == result.sent == 12
    assert a.server is not None and a.server.handler is not None and b.server is not None and b.server.handler
    assert a.server.handler.mean_ms == pytest.approx(A_MS, rel=0.2)
    assert b.server.handler.mean_ms == pytest.approx(B_MS, rel=0.2)
    assert result.latency.p50_ms == pytest.approx(A_MS + B_MS, rel=0.2)
    assert a.latency is not None and b.latency is not None
    # end to end = the stages + what the client spends between them (a JSON answer passed on: next to nothing); the
    # request and each of its calls are timed by their own clock reads, so "nothing" may come out a few µs below 0
    # (a CI run measured -0.010 ms)
    between = result.latency.mean_ms - a.latency.mean_ms - b.latency.mean_ms
    assert -1.0 <= between < 10


def test_two_clients_queue_at_the_bottleneck_as_computed_by_hand(server: Any) -> None:
    result = pipeline(server, concurrency=2, duration=3.0)
    assert result.failed == 0 and result.latency is not None
    assert result.latency.p50_ms == pytest.approx(2 * A_MS, rel=0.2)
    assert result.throughput_rps == pytest.approx(1000 / A_MS, rel=0.2)
    a, b = result.stages["a"].server, result.stages["b"].server
    assert a is not None and a.queue is not None and b is not None and b.queue is not None
    assert a.queue.mean_ms == pytest.approx(A_MS - B_MS, abs=20)  # the wait at A, by hand
    assert b.queue.mean_ms < 10  # B is never busy when a request reaches it
    # the pipeline's server breakdown is the stages' summed
    assert result.server is not None and result.server.queue is not None
    assert result.server.queue.mean_ms == pytest.approx(a.queue.mean_ms + b.queue.mean_ms, abs=5)


def test_open_loop_pipelines_are_timed_from_their_intended_start(server: Any) -> None:
    result = pipeline(server, rate=4.0, duration=3.0)
    assert result.failed == 0 and result.mode == "open" and result.latency is not None
    assert result.latency.p50_ms == pytest.approx(A_MS + B_MS, rel=0.2)
    assert result.throughput_rps == pytest.approx(4.0, rel=0.25)


def test_a_failing_stage_fails_the_pipeline_and_is_named(server: Any) -> None:
    stages = (StageSpec("a", "input"), StageSpec("missing", "answer"))
    result = run_bench(BenchSpec(url=server.inference_url, stages=stages, concurrency=1, requests=3))
    assert result.errors == {"404": 3} and result.stages["a"].failed == 0 and result.stages["missing"].failed == 3


def test_a_hook_from_a_file_makes_the_next_request(server: Any, tmp_path: Path) -> None:
    (tmp_path / "hooks.py").write_text(
        "def twice(answer, source):\n    return [answer, answer]\n\n"
        "def nothing(answer, source):\n    return None\n\n"
        "def broken(answer, source):\n    raise ValueError('no box')\n"
    )

    def run(request: str) -> BenchResult:
        stages = (StageSpec("a", "input"), StageSpec("b", request))
        spec = BenchSpec(url=server.inference_url, stages=stages, concurrency=1, requests=3, hook_dir=tmp_path)
        return run_bench(spec)

    fanned = run("hooks.py:twice")  # two calls of B at once per pipeline
    assert fanned.failed == 0 and fanned.stages["b"].sent == 6 and fanned.stages["a"].sent == 3
    ended = run("hooks.py:nothing")  # the pipeline ends after A, successfully
    assert ended.failed == 0 and "b" not in ended.stages
    broken = run("hooks.py:broken")
    assert broken.errors == {"hook": 3} and any("b's hook raised ValueError: no box" in w for w in broken.warnings)


def test_the_cli_drives_a_pipeline_file_and_reports_each_stage(server: Any, tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({"pipeline": ["a", {"model": "b", "request": "answer"}]}))
    done = subprocess.run(
        [sys.executable, "-m", "servetune", "bench", server.inference_url, "--pipeline", str(tmp_path / "app.yaml"),
         "-c", "1", "-n", "4", "-o", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| a | 4 |" in report and "| b | 4 |" in report and "between stages (client)" in report
    rows = (tmp_path / "out" / "ab_report.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 and "pipeline: a -> b" in rows[1]
    saved = BenchResult.from_json((tmp_path / "out" / "result.json").read_text())
    assert set(saved.stages) == {"a", "b"} and saved.stages["b"].sent == 4


# -- without a server ---------------------------------------------------------------------------------------


def test_crop_top_box_crops_the_input_to_the_best_detection() -> None:
    from PIL import Image

    image = Image.new("RGB", (200, 100), "white")
    source = io.BytesIO()
    image.save(source, format="PNG")
    detections = [
        {"class_name": "drawn_humanoid", "bbox": [10.4, 20, 60, 90], "score": 0.4},
        {"class_name": "drawn_humanoid", "bbox": [100, 10, 180.6, 70], "score": 0.9},
    ]
    crop = crop_top_box(json.dumps(detections).encode(), source.getvalue())
    assert crop is not None and Image.open(io.BytesIO(crop)).size == (81, 60)
    assert top_box([{"person": [1, 2, 3, 4], "score": 0.5}]) == [1, 2, 3, 4]  # TorchServe's object detector
    assert crop_top_box(b"[]", source.getvalue()) is None  # nothing detected: the pipeline ends


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (["a"], r"^pipeline=\['a'\]: expected a list of two or more stages"),
        (["a", {"model": "b", "hook": "x"}], r"^pipeline\[1\]\.hook: unknown key; expected one of model, request"),
        (["a", {"request": "answer"}], r"^pipeline\[1\]\.model: missing"),
        (["a", {"model": "b", "request": 3}], r"^pipeline\[1\]\.request=3: expected a non-empty string"),
    ],
)
def test_invalid_pipelines_name_the_key_and_value(value: Any, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parse_stages("pipeline", value)


def test_invalid_hooks_and_stage_orders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^pipeline\[1\]\.request='crop': expected one of answer, same_input, crop_"):
        load_hook("pipeline[1].request", "crop", tmp_path)
    with pytest.raises(ConfigError, match=r"^pipeline\[1\]\.request='x.py:f': no such file"):
        load_hook("pipeline[1].request", "x.py:f", tmp_path)
    with pytest.raises(ConfigError, match=r"^pipeline\[1\]\.request='input': expected a hook"):
        BenchSpec(url="http://127.0.0.1:1", stages=(StageSpec("a", "input"), StageSpec("b", "input")), requests=1)
    with pytest.raises(ConfigError, match=r"^engine='ab': a pipeline runs on the built-in engine"):
        BenchSpec(url="http://127.0.0.1:1", stages=STAGES, requests=1, engine="ab")
