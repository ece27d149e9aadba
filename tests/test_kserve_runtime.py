"""The KServe runtime's container entrypoint (``servetune kserve``), run here on a read-only copy of TorchServe's
KServe storage layout (no cluster): ``config/config.properties`` as TorchServe's KServe image ships it (with a
``model_snapshot``) and ``model-store/doubler.mar``. It serves the archive on every protocol at once, answers
readiness on ``/v2/health/ready``, and writes nothing into the model directory."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from grpc_models import generate_stubs
from http_client import call
from kserve_models import DOUBLER, DOUBLER_METADATA, archive
from servetune.ready import ReadyInfo

SNAPSHOT = {
    "name": "startup.cfg",
    "modelCount": 1,
    "models": {
        "doubler": {
            "1.0": {
                "defaultVersion": True,
                "marName": "doubler.mar",
                "minWorkers": 1,
                "maxWorkers": 1,
                "batchSize": 4,
                "maxBatchDelay": 200,
                "responseTimeout": 60,
            }
        }
    },
}
# TorchServe's kubernetes/kserve/config.properties, as the old runtime's users have it
CONFIG = f"""inference_address=http://0.0.0.0:8085
management_address=http://0.0.0.0:8085
metrics_address=http://0.0.0.0:8082
grpc_inference_port=7070
grpc_management_port=7071
enable_envvars_config=true
install_py_dep_per_model=true
enable_metrics_api=true
metrics_mode=prometheus
NUM_WORKERS=1
number_of_netty_threads=4
job_queue_size=10
load_models=all
model_store=/home/model-server/shared/model-store
model_snapshot={json.dumps(SNAPSHOT, separators=(",", ":"))}
"""


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def read_only_mount_works(tmp_path: Path) -> bool:
    src, dst = tmp_path / "probe-src", tmp_path / "probe-dst"
    src.mkdir()
    dst.mkdir()
    probe = f"mount --bind -o ro {src} {dst} && ! touch {dst}/x"
    done = subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True, check=False)
    return done.returncode == 0


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReadyInfo, Path, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("kserve")
    if shutil.which("unshare") is None or not read_only_mount_works(tmp):
        pytest.skip("needs unshare -m and a read-only bind mount (a private mount namespace)")
    layout = tmp / "layout"
    (layout / "config").mkdir(parents=True)
    (layout / "config" / "config.properties").write_text(CONFIG)
    store = layout / "model-store"
    archive(store, "doubler", DOUBLER, {"batch_ms": 60, "oip": DOUBLER_METADATA})
    shutil.rmtree(store / ".src-doubler-1.0")
    before = tree_digest(layout)
    mount, ready = tmp / "mnt-models", tmp / "ready.json"
    mount.mkdir()
    entrypoint = [sys.executable, "-m", "servetune", "kserve", "--model-dir", str(mount), "--ready-file", str(ready)]
    entrypoint += ["--http-port", "0", "--grpc-port", "0", "--management-port", "0", "--metrics-port", "0"]
    entrypoint += ["--grpc-management-port", "0"]  # not 7071: another runtime may hold it
    script = f"mount --bind -o ro {layout} {mount} && exec " + " ".join(entrypoint)
    env = {**os.environ, "PROTOCOL_VERSION": "v2"}  # what KServe's webhook adds for a v2 InferenceService
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], cwd=tmp, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), proc.stdout.read() if proc.poll() is not None and proc.stdout else "no ready file"
        yield ReadyInfo.read(ready), layout, before
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert tree_digest(layout) == before, "the model directory must never be written to"


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    return generate_stubs(tmp_path_factory.mktemp("stubs"))


def test_the_snapshot_model_serves_on_every_rest_protocol(runtime: tuple[ReadyInfo, Path, dict[str, str]]) -> None:
    info, _, _ = runtime
    url = info.urls["inference"]
    assert info.failed == {} and info.models == {"doubler": ["1.0"]}
    assert call("GET", f"{url}/v2/health/ready").status == 200
    assert call("GET", f"{url}/v2/health/live").status == 200
    v1 = call("POST", f"{url}/v1/models/doubler:predict", json.dumps({"instances": [[1, 2]]}).encode(),
              {"Content-Type": "application/json"})  # fmt: skip
    assert (v1.status, v1.json()) == (200, {"predictions": [[2.0, 4.0]]}), v1.body
    body = {"inputs": [{"name": "input-0", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}]}
    v2 = call("POST", f"{url}/v2/models/doubler/infer", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert v2.status == 200, v2.body
    assert v2.json()["outputs"][0]["data"] == [3.0, 5.0]
    # TorchServe's own route, in the kservev2 envelope that PROTOCOL_VERSION=v2 selects (as TorchServe on KServe)
    legacy = call("POST", f"{url}/predictions/doubler", json.dumps(body).encode(), {"Content-Type": "application/json"})
    assert legacy.status == 200, legacy.body
    assert json.loads(legacy.body)["outputs"][0]["data"] == [3.0, 5.0]
    metrics = call("GET", f"{info.urls['metrics']}/metrics").body.decode()
    assert "ts_inference_requests_total{" in metrics and 'model_name="doubler"' in metrics


def test_the_snapshot_model_serves_on_grpc(
    runtime: tuple[ReadyInfo, Path, dict[str, str]], stubs: dict[str, ModuleType]
) -> None:
    info, _, _ = runtime
    target = info.urls["grpc_inference"].removeprefix("grpc://")
    with grpc.insecure_channel(target) as channel:
        pb = stubs["open_inference_grpc_pb2"]
        oip = stubs["open_inference_grpc_pb2_grpc"].GRPCInferenceServiceStub(channel)
        assert oip.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
        request = pb.ModelInferRequest(model_name="doubler", id="k1")
        tensor = request.inputs.add(name="input-0", datatype="FP32", shape=[1, 2])
        tensor.contents.fp32_contents.extend([1.0, 2.0])
        answer = oip.ModelInfer(request, timeout=60)
        assert answer.id == "k1" and answer.model_name == "doubler"
        assert list(answer.outputs[0].contents.fp64_contents) or answer.raw_output_contents
