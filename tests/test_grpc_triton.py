"""Triton's Python client (``tritonclient[grpc]``) against servetune's Open Inference Protocol gRPC service: health,
metadata, inference with raw contents (what its InferInput sends) and typed contents (through its own generated
stub), and its errors. tritonclient pins protobuf < 7, so it runs in a venv of its own, built once per machine by
scripts/client_venv (about a minute from PyPI, then cached); skipped when that venv cannot be built (no index)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpc_models import tensor_archive
from servetune.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def triton_python() -> Path:
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "client_venv"), "tritonclient"], capture_output=True, text=True
    )
    if built.returncode != 0:
        pytest.skip(f"the tritonclient venv could not be built: {built.stderr[-500:]}")
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    store = tmp_path_factory.mktemp("store")
    tensor_archive(store, batch_ms=1)
    properties = {"default_workers_per_model": "1", "disable_token_authorization": "true"}
    with EmbeddedServer(store, {"tensor": "tensor.mar"}, properties) as running:
        yield running


def test_tritonclient_passes_against_the_oip_grpc_service(triton_python: Path, server: EmbeddedServer) -> None:
    script = Path(__file__).with_name("triton_grpc_client.py")
    run = subprocess.run(
        [str(triton_python), str(script), server.grpc_inference_target, "tensor"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert (seen["live"], seen["ready"], seen["model_ready"]) == (True, True, True)
    assert seen["server"]["name"] == "servetune"
    assert seen["metadata"]["name"] == "tensor" and seen["metadata"]["versions"] == ["1.0"]
    assert seen["raw"] == {"y": [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]], "id": "t1"}
    assert seen["bytes"] == ["hello", "world"]
    assert seen["typed"] == {"y": [2, 4, 6], "raw": 0}
    assert seen["errors"] == {"unknown_model": "StatusCode.NOT_FOUND", "wrong_shape": "StatusCode.INVALID_ARGUMENT"}
