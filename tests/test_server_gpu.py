"""GPU placement: workers are assigned round-robin over the GPUs, and forked from a parent that never started CUDA
(skipped without CUDA)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import psutil
import pytest
import torch

from http_client import call
from models import handler_archive, sleep_archive

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


GPU_HANDLER = textwrap.dedent(
    """
    import os

    import torch

    HELD = None

    def handle(data, context):
        global HELD
        if data is None:
            HELD = torch.zeros(64 * 2**18, device=f"cuda:{context.system_properties['gpu_id']}")
            return None
        return [{"pid": os.getpid(), "cuda": torch.cuda.is_initialized()} for _ in data]
    """
)


def test_gpu_workers_are_forked_from_a_parent_that_imported_torch_without_cuda(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    """A forked child cannot use a CUDA context made before the fork: on a GPU the model's parent only imports the
    handler's module (torch: shared by the workers), refuses to fork if CUDA started in it, and each worker starts
    CUDA itself."""
    store = tmp_path / "store"
    handler_archive(store, "cuda", "cuda_handler.py", GPU_HANDLER, {"deviceType": "gpu", "workerPreload": "model"})
    server = start_server(model_store=store, models={"cuda": "cuda.mar"}, properties={"default_workers_per_model": "2"})
    pids = {w["pid"] for w in call("GET", f"{server.management_url}/models/cuda").json()[0]["workers"]}
    seen: set[int] = set()
    for _ in range(40):  # each worker answers once at least (its GPU memory is reported with its answers)
        reply = call("POST", f"{server.inference_url}/predictions/cuda", b"x")
        assert reply.status == 200 and reply.json()["cuda"] is True
        seen.add(reply.json()["pid"])
        if seen == pids:
            break
    assert seen == pids
    parents = {psutil.Process(pid).ppid() for pid in pids}
    assert len(parents) == 1 and server.proc.pid not in parents
    [parent] = parents
    assert "servetune.server.forkserver" in psutil.Process(parent).cmdline()
    assert "libtorch" in Path(f"/proc/{parent}/maps").read_text()  # torch imported once, in the parent
    for worker in call("GET", f"{server.management_url}/models/cuda").json()[0]["workers"]:
        assert worker["gpuMemoryUsage"] >= 64 * 2**20
