"""The Ray backend on a real two-node Ray cluster (``ray start`` head + a second node, on this machine).

One cluster and one ``servetune serve --backend ray`` driver for the module; the tests run in order: bench unchanged,
scale 1 -> 2 -> 1 across the two nodes, SIGKILL a replica and see it replaced, the tuner through the management API,
stop clean. What the API answers (inference, management, metrics) is checked on Ray and on the native server by the
same suite, tests/test_api_backends.py.
The cluster (``ray_cluster.py``) is stopped at the end by the process ids it started (never ``ray stop``, which
would stop every Ray cluster on the machine).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'servetune[ray]')")

from http_client import wait_for  # noqa: E402
from models import sleep_archive  # noqa: E402
from ray_cluster import START_TIMEOUT_S, LocalRayCluster, cluster_fixture  # noqa: E402, F401
from servetune.bench import BenchSpec, run_bench  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402

pytestmark = pytest.mark.slow

# 100 ms a batch whatever its size, registered at batch 4 and a delay of 400 ms; the controller's bounds hold the delay
# at 0, and its SLA (P99 280 ms) lets a request wait for one batch and run in the next: in a burst of twelve, at most
# two batches of four make it (five when the first batch went with one) and those behind are shed
CONTROLLED: dict[str, Any] = {
    "batchSize": 4,
    "maxBatchDelay": 400,
    "controller": {
        "slo": {"p99_ms": 280},
        "bounds": {"batch_size": [1, 4], "max_batch_delay_ms": [0, 0]},
        "shed": True,
    },
}


def _post(url: str, body: bytes = b"hello", timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _get(url: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def server(cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("store")
    sleep_archive(store, batch_ms=100, model_config={"batchSize": 4, "maxBatchDelay": 150})
    sleep_archive(store, name="other", batch_ms=1)
    sleep_archive(store, name="late", batch_ms=1)
    sleep_archive(store, name="ctl", batch_ms=100, model_config=CONTROLLED)
    refused = {**CONTROLLED, "controller": {**CONTROLLED["controller"], "bounds": {"workers": [1, 2]}}}
    sleep_archive(store, name="ctlbad", batch_ms=1, model_config=refused)
    slow = {"controller": {"slo": {"p99_ms": 100}, "probe": "x"}}  # a batch of one takes 300 ms: no SLA of 100 holds
    sleep_archive(store, name="ctlslow", batch_ms=300, model_config=slow)
    properties = {"disable_token_authorization": "true", "default_workers_per_model": "1", "enable_model_api": "true"}
    running = EmbeddedServer(
        store,
        {"sleep": "sleep.mar", "other": "other.mar"},
        properties,
        backend="ray",
        ray_address=cluster.address,
        workdir=tmp_path_factory.mktemp("driver"),
        startup_timeout=START_TIMEOUT_S,
    )
    try:
        yield running.start()
    finally:
        running.stop()


class Client:
    def __init__(self, server: EmbeddedServer) -> None:
        self.inference = server.inference_url
        self.management = server.management_url

    def predict(self, body: bytes = b"hello", model: str = "sleep") -> tuple[int, dict[str, str], bytes]:
        return _post(f"{self.inference}/predictions/{model}", body)

    def worker_pids(self) -> list[int]:
        status, described = _get(f"{self.management}/models/sleep")
        assert status == 200, described
        return [w["pid"] for w in described[0]["workers"]]

    def serving_pids(self, requests: int = 16) -> set[int]:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: self.predict(f"p{i}".encode()), range(requests)))
        return {json.loads(body)["pid"] for status, _, body in results if status == 200}

    def scale(self, workers: int) -> None:
        url = f"{self.management}/models/sleep?min_worker={workers}&synchronous=true&timeout=90"
        status, answer = _get(url, method="PUT")
        assert (status, answer) == (200, {"status": f"Workers scaled to {workers} for model: sleep"})


def test_bench_measures_the_ray_backend_unchanged(server: EmbeddedServer) -> None:
    spec = BenchSpec(
        url=f"{server.inference_url}/predictions/sleep",
        content_type="text/plain",
        concurrency=4,
        requests=40,
        management_url=server.management_url,
    )
    result = run_bench(spec)
    assert result.failed == 0, result.errors
    assert result.samples is not None and min(result.samples.handler_ms) >= 100.0
    assert result.labels["batch_size"] == "4" and result.labels["workers"] == "1"


def test_scale_up_kill_a_replica_and_scale_down(server: EmbeddedServer) -> None:
    client = Client(server)
    [first] = client.worker_pids()
    client.scale(2)
    pids = client.worker_pids()
    assert len(pids) == 2 and first in pids, "scaling up must keep the running replica"
    wait_for(lambda: client.serving_pids() == set(pids), 60, "both replicas to serve")

    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    codes = [client.predict(b"during")[0] for _ in range(10)]  # the survivor keeps serving meanwhile
    assert codes.count(200) >= 8, codes
    replaced = wait_for(
        lambda: (p := client.worker_pids()) and len(p) == 2 and victim not in p and p, 90, "a replacement replica"
    )
    assert replaced[0] in pids  # the survivor, then the new one
    wait_for(lambda: _get(f"{client.inference}/ping") == (200, {"status": "Healthy"}), 60, "ping Healthy")
    wait_for(lambda: client.serving_pids() == set(replaced), 60, "traffic on both replicas")

    client.scale(1)
    [left] = client.worker_pids()
    assert left in replaced
    assert client.serving_pids() == {left}


def test_the_only_replica_killed_comes_back(server: EmbeddedServer) -> None:
    client = Client(server)
    [victim] = client.worker_pids()
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: client.predict(b"again")[0] == 200, 90, "traffic to recover")
    status, _, body = client.predict(b"after")
    assert status == 200 and json.loads(body)["pid"] != victim


def test_tuner_tunes_the_ray_deployment_through_its_management_api(server: EmbeddedServer, tmp_path: Path) -> None:
    from servetune.tune import Remote, load_study, tune

    (tmp_path / "in.txt").write_text("hello")
    study_file = tmp_path / "study.yaml"
    study_file.write_text(
        "model: sleep\narchive: in.txt\ninput: in.txt\nsla: {p99_ms: 2000}\nbudget: 2m\n"
        "strategy: {name: grid, remeasure: 0, finalists: 0}\n"  # re-measures and finalists: test_tune_e2e.py
        "space: {workers: [1], batch_size: [1, 4], batch_delay_ms: [20]}\nload: {duration: 1.5s, warmup: 0.5s}\n"
    )
    result = tune(load_study(study_file), tmp_path / "out", remote=Remote(server.inference_url, server.management_url))
    winner = result.analysis.winner
    assert winner is not None and winner.config.batch_size == 4, result.analysis
    # the tuner put the model back as it found it: batch 4, delay 150 ms, one worker
    status, described = _get(f"{server.management_url}/models/sleep")
    assert (described[0]["batchSize"], described[0]["maxBatchDelay"], len(described[0]["workers"])) == (4, 150, 1)
    assert Client(server).predict(b"after tuning")[0] == 200


def test_each_replica_runs_the_controller_moves_its_batching_and_sheds(server: EmbeddedServer) -> None:
    management = server.management_url
    # what a replica cannot move is refused at registration, naming the key
    status, answer = _get(f"{management}/models?url=ctlbad.mar&initial_workers=1&synchronous=true", method="POST")
    assert status == 400 and "controller.bounds.workers" in answer["message"], answer
    # an SLA the model cannot make: the replica's probe fails its load, and the registration with it
    status, answer = _get(f"{management}/models?url=ctlslow.mar&initial_workers=1&synchronous=true", method="POST")
    assert "Traceback" not in answer["message"], answer  # Ray's own line and the exception's: no Python stack
    assert status == 500 and "controller.slo.p99_ms=100 is below the model's batch-1 time" in answer["message"], answer
    assert _get(f"{management}/models/ctlslow")[0] == 404  # nothing left registered
    status, answer = _get(f"{management}/models?url=ctl.mar&initial_workers=1&synchronous=true", method="POST")
    assert status == 200, answer
    try:
        url = f"{server.inference_url}/predictions/ctl"
        for i in range(6):  # the fit learns t(1) = 100 ms (a cold model sheds nothing meanwhile)
            status, headers, _ = _post(url, f"warm{i}".encode())
            assert status == 200
        # the controller took the delay from the registered 400 ms to its bound, 0: a request alone waits no batch
        assert float(headers["x-servetune-queue-ms"]) < 150, headers

        def timed(i: int) -> tuple[int, dict[str, str], float]:
            started = time.monotonic()
            status, headers, _ = _post(url, f"b{i}".encode())
            return status, headers, time.monotonic() - started

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(timed, range(12)))
        served = [r for r in results if r[0] == 200]
        shed = [r for r in results if r[0] == 503]
        assert len(served) + len(shed) == 12 and len(served) >= 2 and len(shed) >= 2, results
        # answered when it reached the replica, not held for a batch: within a second (a contended suite run here
        # answered one after 0.62 s through Ray's proxy and router queue: 0.5 s was too tight for this machine)
        for _, headers, seconds in shed:
            assert seconds < 1.0 and int(headers["retry-after"]) >= 1, (seconds, headers)

        def described() -> dict[str, Any]:
            status, answer = _get(f"{management}/models/ctl")
            assert status == 200, answer
            block: dict[str, Any] = answer[0]["controller"]
            return block

        [pid] = [str(w["pid"]) for w in _get(f"{management}/models/ctl")[1][0]["workers"]]

        def reported_shed() -> bool:
            return bool(described()["replicas"].get(pid, {}).get("shed", 0) >= len(shed))

        wait_for(reported_shed, 10, "the replica's report of the requests it shed")
        replica = described()["replicas"][pid]
        # the delay at its bound; the cap within bounds (the fit tells b = 0 once a batch of two or more has run)
        assert replica["knobs"]["max_batch_delay_ms"] == 0 and replica["knobs"]["workers"] == 1, replica
        assert 1 <= replica["knobs"]["batch_size"] <= 4, replica
        assert replica["knobChanges"] >= 1 and replica["fit"]["batches"] >= 6
        assert described()["settings"]["shed"] is True
        shed_line = f'servetune_controller_shed_total{{model_name="ctl",model_version="1.0",worker_id="{pid}"}}'

        def exported_shed() -> list[str]:  # the driver sums the replicas' reports every second
            with urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=30) as response:
                lines = response.read().decode().splitlines()
            return [line for line in lines if line.startswith(shed_line) and float(line.split()[-1]) >= len(shed)]

        wait_for(exported_shed, 10, shed_line)
    finally:
        _get(f"{management}/models/ctl/1.0", method="DELETE")


def test_driver_stops_cleanly_and_removes_the_replicas(server: EmbeddedServer) -> None:
    pids = Client(server).worker_pids()
    assert server.stop() == 0
    assert "Model server stopped." in server.output
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 30, "the replicas to exit")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))


def test_a_proxy_slow_to_become_ready_is_waited_for(tmp_path: Path) -> None:
    """Ray Serve kills a proxy that misses three ready checks (5 s each by default) and starts another. On a busy
    host (a CI run) a first proxy was not ready after 15 s: killed while ``serve_start`` waited for it, it failed the
    server's start (every [ray] API test). A local instance the server starts now checks every 30 s, and a proxy
    killed during the start is waited out. Here the checks are shortened and each proxy is slow, so that the first
    two are killed (the controller's log says so): the server starts and answers. (Whether ``serve_start`` was
    waiting for the first proxy when it died is Ray's timing: this test does not fail on the code before.)"""
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=1)
    running = EmbeddedServer(
        store,
        {"sleep": "sleep.mar"},
        {"disable_token_authorization": "true", "default_workers_per_model": "1"},
        backend="ray",
        ray_address="local",
        ray_num_cpus=2,
        workdir=tmp_path / "driver",
        startup_timeout=START_TIMEOUT_S,
    )
    # Ready checks of 0.5 s (then 1, 1.5 s: Serve waits longer for each new proxy), three missed kill a proxy; each
    # proxy takes 2.5 s more to start (its callback): the first two are killed, the third becomes ready.
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    running.env.update({"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "0.5", "SLOW_PROXY_S": "2.5", "PYTHONPATH": path,
                        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "slow_proxy:middlewares"})  # fmt: skip
    try:
        running.start()
        status, _, body = _post(f"{running.inference_url}/predictions/sleep")
        assert status == 200 and json.loads(body)["echo"] == "hello", body
        # the premise: proxies were killed as the server started (the instance's own log; Ray tests run one at a time)
        logs = Path(tempfile.gettempdir(), "ray", "session_latest", "logs", "serve").glob("controller_*.log")
        killed = sum(log.read_text().count("Shutting down the unhealthy proxy") for log in logs)
        assert killed >= 1, "no proxy was killed: the test did not test what it says"
    finally:
        running.stop()
