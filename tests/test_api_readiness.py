""" "Ready" means ready: a server with a slow-loading start-up model, polled from its first instant as the Animated
Drawings app and Kubernetes poll it (``/ping``, then a prediction, in a tight loop), never says Healthy before the
model answers, and never answers 404 for it. A start-up model that fails to load keeps ``/ping`` Unhealthy."""

from __future__ import annotations

import importlib.util
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from backends import BACKENDS
from models import sleep_archive
from ray_cluster import cluster_fixture  # noqa: F401  (the fixture ``cluster``)

LOAD_S = 4.0
# between two polls of a starting server: a loop without a pause took a whole core from the start it watched (a
# refused connection returns at once), on a machine whose two cores the other tests share
POLL_S = 0.02


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status_of(method: str, url: str) -> int:
    request = urllib.request.Request(url, data=b"x" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0  # not listening yet


def start(
    tmp_path: Path, backend: str, models: str, request: pytest.FixtureRequest
) -> tuple[subprocess.Popen[str], str]:
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed")
    # Ray: the run's cluster (ray_cluster.py), asked for by the first Ray test; each server shuts its Serve down
    address = request.getfixturevalue("cluster").address if backend == "ray" else "local"
    port = free_port()
    config = tmp_path / "config.properties"
    config.write_text(
        f"inference_address=http://127.0.0.1:{port}\nmanagement_address=http://127.0.0.1:{free_port()}\n"
        f"metrics_address=http://127.0.0.1:{free_port()}\ndisable_token_authorization=true\n"
        "grpc_inference_port=0\ngrpc_management_port=0\n"  # never TorchServe's 7070/7071: another server may hold them
        "default_workers_per_model=1\n"
    )
    args = [sys.executable, "-m", "servetune", "serve", "--ts-config", str(config), "--backend", backend]
    args += ["--model-store", str(tmp_path / "store"), "--models", models, "--ray-address", address]
    args += ["--ready-file", str(tmp_path / "ready.json")]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_ping_says_healthy_only_once_the_start_up_model_answers(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    sleep_archive(tmp_path / "store", batch_ms=1, model_config={"sleep": {"load_s": LOAD_S}})
    proc, url = start(tmp_path, backend, "sleep=sleep.mar", request)
    seen: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            ping = status_of("GET", f"{url}/ping")
            predict = status_of("POST", f"{url}/predictions/sleep")
            seen.append((ping, predict))
            if ping == 200 and len([s for s in seen if s[0] == 200]) >= 20:
                break
            time.sleep(POLL_S)
    finally:
        output = stop(proc)
    healthy = [i for i, (ping, _) in enumerate(seen) if ping == 200]
    assert healthy, f"/ping never said Healthy: {seen[-5:]}\n{output}"
    before = seen[: healthy[0]]
    assert any(ping == 500 for ping, _ in before), f"the server was not polled while it started: {before[-10:]}"
    assert all(predict == 200 for _, predict in seen[healthy[0] :]), seen[healthy[0] :]
    assert all(predict != 404 for _, predict in seen), "a start-up model must never be 404"
    assert "Model server started." in output


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_start_up_model_that_fails_keeps_ping_unhealthy(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    sleep_archive(tmp_path / "store", batch_ms=1)
    sleep_archive(tmp_path / "store", name="broken", model_config={"sleep": {"fail_load": True}})
    proc, url = start(tmp_path, backend, "sleep=sleep.mar broken=broken.mar", request)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "ready.json").exists() and time.monotonic() < deadline:  # "Model server started."
            time.sleep(0.2)
        assert status_of("POST", f"{url}/predictions/sleep") == 200
        request = urllib.request.Request(f"{url}/ping")
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(request, timeout=30)
        assert failed.value.code == 500
        body = failed.value.read().decode()
        assert '"Unhealthy"' in body and "broken" in body and "fail_load" in body
    finally:
        output = stop(proc)
    assert "ERROR: failed to load model broken" in output and "cannot load: fail_load is set" in output
