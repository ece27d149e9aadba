"""GPU placement: workers are assigned round-robin over the GPUs (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from http_client import call
from models import sleep_archive

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_workers_get_gpus_round_robin(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, model_config={"deviceType": "gpu"})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"},
                          properties={"default_workers_per_model": "2"})
    workers = call("GET", f"{server.management_url}/models/sleep").json()[0]["workers"]
    assert len(workers) == 2 and all(w["gpu"] for w in workers)
    assert call("POST", f"{server.inference_url}/predictions/sleep", b"x").status == 200



def test_describe_reports_the_workers_gpu_memory(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, model_config={"deviceType": "gpu", "sleep": {"cuda_mb": 64}})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    assert call("POST", f"{server.inference_url}/predictions/sleep", b"x").status == 200
    (worker,) = call("GET", f"{server.management_url}/models/sleep").json()[0]["workers"]
    assert worker["gpuMemoryUsage"] >= 64 * 2**20
    assert worker["gpuUsage"].startswith(f"gpuId::{worker['gpuId']} memory.used [MiB]::")
