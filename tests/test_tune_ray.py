"""``servetune tune --backend ray`` end to end on a real two-node Ray cluster (``ray_cluster.py``), with the model
whose cost is known (``tune_models.py``): each batch costs 200 ms + 40 ms x batch size, at most 2 batches at once.

Clients = batch size x workers (closed loop), workers [1, 2] x batch [1, 4], SLA P99 <= 1500 ms. By hand
(``expected_closed_loop``, as in test_tune_e2e.py): 2 workers x batch 4 serve 22 req/s in 360 ms; everything else
serves at most 14 req/s, with or without 150 ms of Ray's proxy per request. The model is slower and the SLA looser
than test_tune_e2e.py's: Ray's proxy, router and node processes cost CPU per request, and on 2 busy cores a CI run
at twice this rate measured 2 workers x batch 4 at 26 req/s, P99 499 ms (58% and 2.8x of the model's own figures),
and a run beside another test file measured it at P99 935 ms: the SLA leaves room for that, and the best stays the
best (the highest throughput of the space). The tests that read the tuning's outcome run with the machine to
themselves (``alone``): a CI run where ``test_pt2.py`` compiled on the other core through the whole tuning measured
every run of 2 workers x batch 4 contended, after its retries, and named 1 worker x batch 4 (9.5 req/s).

The tuner starts ``servetune serve --backend ray`` on the cluster, registers the family's archive, changes batching
in place and scales replicas between trials, then writes the winner as a ``serve deploy`` file too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'servetune[ray]')")

from ray_cluster import LocalRayCluster, cluster_fixture  # noqa: E402, F401
from servetune.tune import Config  # noqa: E402
from tune_models import best_by_hand, cost_archive  # noqa: E402

pytestmark = pytest.mark.slow

A_MS, B_MS, SLOTS, SLA_MS = 200.0, 40.0, 2, 1500.0
SPACE = {"workers": [1, 2], "batch_size": [1, 4], "batch_delay_ms": [50]}
BEST = Config("eager/cpu", 2, 4, 50)


def by_hand(overhead_ms: float) -> Config:
    return best_by_hand(SPACE, a_ms=A_MS, b_ms=B_MS, slots=SLOTS, sla_ms=SLA_MS, overhead_ms=overhead_ms)


class Tuned:
    def __init__(self, done: subprocess.CompletedProcess[str], out: Path, address: str) -> None:
        self.done = done
        self.out = out
        self.address = address
        lines = (out / "trials.jsonl").read_text().splitlines()
        self.trials: list[dict[str, Any]] = [json.loads(line) for line in lines[1:]]


@pytest.fixture(scope="module")
def tuned(cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> Tuned:
    """The study file names no backend: the command line puts it on the cluster."""
    folder = tmp_path_factory.mktemp("tune-ray")
    model = cost_archive(folder / "store", folder / "locks", a_ms=A_MS, b_ms=B_MS, slots=SLOTS)
    study = {
        "model": "cost",
        "archive": str(model),
        "sla": {"p99_ms": SLA_MS},
        "space": SPACE,
        "load": {"duration": "1.5s", "warmup": "0.3s"},
        "strategy": {"name": "grid", "remeasure": 0, "finalists": 0},  # re-measures: test_tune_e2e.py
        # a run while other processes took the CPU is measured again (CI: a test file on the other worker took 1.65
        # cores through 2 workers x batch 4's only run, measured at 9.0 req/s against 22 by hand)
        "contention": {"retries": 3},
        # A replica holds one batch: with two (the default), Ray's router may queue a batch behind a busy replica
        # while the other idles, and this closed loop has exactly one batch per replica (2 x batch 1 measured
        # P90 482 ms, two model calls, instead of 240 ms).
        "model_config": {"rayOngoingBatches": 1},
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    out = folder / "out"
    command = [sys.executable, "-m", "servetune", "tune", str(path), "--out", str(out)]
    done = subprocess.run(
        [*command, "--backend", "ray", "--ray-address", cluster.address],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    return Tuned(done, out, cluster.address)


def test_the_hand_computed_best_is_robust_to_serving_overhead() -> None:
    assert by_hand(0) == by_hand(150) == BEST


@pytest.mark.alone
def test_tuning_on_ray_finds_the_hand_computed_best(tuned: Tuned) -> None:
    assert tuned.done.returncode == 0, tuned.done.stderr[-3000:]
    assert f"on Ray ({tuned.address})" in " ".join(tuned.done.stderr.split())  # rich wraps lines
    assert "winner: eager on cpu, 2 workers, batch 4, delay 50 ms" in tuned.done.stdout, tuned.done.stdout
    assert all(t["status"] == "ok" for t in tuned.trials), [t.get("error") for t in tuned.trials]
    measured = {(t["config"]["workers"], t["config"]["batch_size"]) for t in tuned.trials}
    assert measured == {(w, b) for w in SPACE["workers"] for b in SPACE["batch_size"]}
    # the replicas ran on this machine: the Ray backend's describe reports their memory as the native one does
    assert all(t["memory_bytes"] > 0 for t in tuned.trials)
    report = (tuned.out / "report.md").read_text()
    assert f"server: Ray Serve ({tuned.address})" in report
    assert "serve deploy " in report and "servetune serve --backend ray" in report


@pytest.mark.alone
def test_the_winner_is_written_as_a_schema_valid_ray_serve_config(tuned: Tuned) -> None:
    deploy = tuned.out / "deploy"
    written = yaml.safe_load((deploy / "ray-serve-config.yaml").read_text())
    with warnings.catch_warnings():  # Ray's schema module uses pydantic features deprecated in 2.x
        warnings.simplefilter("ignore", DeprecationWarning)
        from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(written)
    assert written["http_options"] == {"host": "0.0.0.0", "port": 8000}
    [app] = [a for a in written["applications"] if a["route_prefix"] == "/predictions/cost"]
    [deployment] = app["deployments"]
    assert deployment["num_replicas"] == 2
    assert {k: v for k, v in deployment["user_config"].items() if k != "model"} == {
        "batch_size": 4,
        "max_batch_delay_ms": 50,
        "num_threads": 1,
    }
    spec = app["args"]["version"]
    assert spec["config"]["batch_size"] == 4 and spec["config"]["handler_config"]["optimization"] == "eager"
    assert Path(spec["archive"]) == (deploy / "model-store" / "cost").resolve()
    command, alternative, *more = (deploy / "serve-command.txt").read_text().splitlines()
    properties = (deploy / "config.properties").resolve()
    assert command == f"servetune serve --backend ray --ray-address {tuned.address} --ts-config {properties}"
    assert alternative.endswith(f"serve deploy {(deploy / 'ray-serve-config.yaml').resolve()}")
    # for a load that moves, the online controller as a replica runs it: its batching only, the replicas Ray's
    assert more == [
        "# for a load that moves: rebuild the archive with model-config.controller.yaml (the online controller)"
    ]
    controlled = yaml.safe_load((deploy / "model-config.controller.yaml").read_text())["controller"]
    bounds = {"batch_size": [1, 4], "max_batch_delay_ms": [50, 50]}
    assert controlled == {"slo": {"p99_ms": SLA_MS}, "bounds": bounds, "shed": True}


def test_without_an_address_the_trials_run_on_a_private_local_instance(tmp_path: Path) -> None:
    """``backend: ray`` in the study file, no address: a Ray instance inside the tuner's server, gone with it. The
    study does not say how many batches a replica holds: both 1 and 2 are measured, and the winner's is deployed."""
    from servetune.tune import load_study, tune

    model = cost_archive(tmp_path / "store", tmp_path / "locks", a_ms=20, b_ms=5, slots=2)
    study = {
        "model": "cost",
        "archive": str(model),
        "backend": "ray",
        "space": {"workers": [1], "batch_size": [2], "batch_delay_ms": [20]},
        "load": {"duration": "1s", "warmup": "0.2s"},
        "strategy": {"name": "grid", "remeasure": 0, "finalists": 0},
        "contention": {"retries": 0},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    spawned: dict[int, str] = {}  # this test's descendants: the tuner's server and the Ray instance it starts
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.3):
            for child in psutil.Process().children(recursive=True):
                try:
                    spawned.setdefault(child.pid, " ".join(child.cmdline()))
                except psutil.Error:
                    pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = tune(load_study(tmp_path / "study.yaml"), tmp_path / "out")
    finally:
        done.set()
        watcher.join()
    assert [t.status for t in result.trials] == ["ok", "ok", "ok"], [t.error for t in result.trials]
    assert all(t.result is not None and t.result.failed == 0 for t in result.trials)
    assert [t.config.key for t in result.trials] == ["eager/cpu/q2|w1|b1|d20", "eager/cpu/q1|w1|b2|d20",
                                                     "eager/cpu/q2|w1|b2|d20"]  # fmt: skip
    assert "server: Ray Serve (a local Ray instance)" in (tmp_path / "out" / "report.md").read_text()
    assert result.deployment is not None and "ray-serve-config.yaml" in result.deployment.files
    assert result.analysis.winner is not None
    held = result.study.family(result.analysis.winner.config.family).options["ongoing_batches"]
    written = yaml.safe_load(result.deployment.files["ray-serve-config.yaml"].read_text())
    [app] = [a for a in written["applications"] if a["route_prefix"] == "/predictions/cost"]
    assert held in (1, 2) and app["deployments"][0]["max_ongoing_requests"] == 2 * held  # batch 2 x batches held

    def leftovers() -> list[str]:
        found = []
        for pid in spawned:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(" ".join(proc.cmdline())[:120])
            except psutil.Error:
                pass
        return found

    assert any("raylet" in command for command in spawned.values()), "no Ray instance was started by the server"
    deadline = time.monotonic() + 20
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(), "the private Ray instance outlived the tuner's server"
