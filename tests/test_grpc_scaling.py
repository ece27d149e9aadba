"""Scaling through TorchServe's gRPC management API (clients generated from its protos) while both gRPC servers are
busy: every worker start succeeds, and nothing in the server's log says something broke (issue 18, items 4 and 5).

Worker start used to fork the frontend (uvloop's subprocess: libuv's fork()), which ran gRPC's fork handlers in a
copy of a process whose gRPC threads were busy: gRPC logged ``fork_posix.cc ... skipping fork() handlers`` at each
start and, now and then, the new worker segfaulted before it could exec. An unregister during a scale-up left the
scale to drop slots that were gone (``list.remove(x): x not in list``) or to start workers for a removed model.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import grpc
import psutil
import pytest

from grpc_models import generate_stubs
from models import sleep_archive
from servetune.embedded import EmbeddedServer

# A log line that says something broke: an ERROR record, a traceback, gRPC's fork warning, a worker that died.
BROKEN = re.compile(r"\[ERROR\]|Traceback|exception was never retrieved|fork_posix|exited while loading", re.I)


class Api:
    def __init__(self, server: EmbeddedServer, pb: dict[str, ModuleType]) -> None:
        self.server = server
        self.pb = pb
        targets = (server.grpc_inference_target, server.grpc_management_target)
        self.channels = [grpc.insecure_channel(target) for target in targets]
        self.inference = pb["inference_pb2_grpc"].InferenceAPIsServiceStub(self.channels[0])
        self.management = pb["management_pb2_grpc"].ManagementAPIsServiceStub(self.channels[1])

    def manage(self, rpc: str, **fields: Any) -> str:
        request = getattr(self.pb["management_pb2"], f"{rpc}Request")(**fields)
        return str(getattr(self.management, rpc)(request, timeout=180).msg)

    def workers(self, model: str) -> list[dict[str, Any]]:
        return list(json.loads(self.manage("DescribeModel", model_name=model))[0]["workers"])

    def processes(self) -> set[int]:
        assert self.server.proc is not None
        return {c.pid for c in psutil.Process(self.server.proc.pid).children(recursive=True)}

    def broken(self, since: int = 0) -> list[str]:
        """The log lines from line ``since`` on that say something broke."""
        return [line for line in self.server.output[since:] if BROKEN.search(line)]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    pb = generate_stubs(tmp_path_factory.mktemp("stubs"))
    store = tmp_path_factory.mktemp("store")
    sleep_archive(store, "noop", batch_ms=1.0)
    # Each worker loads for 0.5 s, forked from a parent that imported the handler only (one that loaded the model
    # would fork ready workers in milliseconds: no scale would still be loading when the unregister comes).
    slow = {"workerPreload": "imports", "sleep": {"load_s": 0.5}}
    sleep_archive(store, "slow", batch_ms=1.0, model_config=slow)
    properties = {"default_workers_per_model": "1", "disable_token_authorization": "true", "enable_model_api": "true"}
    with EmbeddedServer(store, {"noop": "noop.mar"}, properties, workdir=tmp_path_factory.mktemp("server")) as server:
        api = Api(server, pb)
        yield api
        for channel in api.channels:
            channel.close()


def test_scaling_up_and_down_beside_busy_grpc_servers_starts_every_worker(api: Api) -> None:
    stop = threading.Event()
    calls: Counter[str] = Counter()

    def predict() -> None:
        request = api.pb["inference_pb2"].PredictionsRequest(model_name="noop", input={"data": b"ok"})
        while not stop.is_set():
            try:
                api.inference.Predictions(request, timeout=60)
                calls["predict"] += 1
            except grpc.RpcError as exc:
                calls[f"predict {exc.code().name}"] += 1

    def describe() -> None:
        while not stop.is_set():
            api.manage("DescribeModel", model_name="noop")
            calls["describe"] += 1

    busy = [threading.Thread(target=predict), threading.Thread(target=predict), threading.Thread(target=describe)]
    for thread in busy:
        thread.start()
    answers = []
    try:
        for _ in range(3):  # 6 worker starts, two at a time, and 6 retired
            for workers in (3, 1):
                answers.append(api.manage("ScaleWorker", model_name="noop", min_worker=workers, synchronous=True))
    finally:
        stop.set()
        for thread in busy:
            thread.join(60)
    assert answers == ["Workers scaled to 3 for model: noop", "Workers scaled to 1 for model: noop"] * 3
    assert set(calls) == {"predict", "describe"} and calls["predict"] > 10, calls
    assert [w["status"] for w in api.workers("noop")] == ["READY"]
    assert api.broken() == []


def test_concurrent_scales_and_an_unregister_during_a_scale_up_break_nothing(api: Api) -> None:
    before, logged = api.processes(), len(api.server.output)
    # TorchServe's management_data.json rows 51-53, right after an asynchronous registration: two asynchronous
    # ScaleWorker calls, then a synchronous one, while the registration's workers still load.
    assert api.manage("RegisterModel", url="slow.mar", initial_workers=2) == "Processing worker updates..."
    for gpus in (10, -1):
        assert api.manage("ScaleWorker", model_name="slow", number_gpu=gpus) == "Processing worker updates..."
    scaled = api.manage("ScaleWorker", model_name="slow", min_worker=1, max_worker=1, synchronous=True)
    assert scaled == "Workers scaled to 1 for model: slow"
    assert [w["status"] for w in api.workers("slow")] == ["READY"]
    # Unregister while a scale-up's workers load: the scale stops what it started, and nothing is left.
    assert api.manage("ScaleWorker", model_name="slow", min_worker=3) == "Processing worker updates..."
    time.sleep(0.3)
    assert api.manage("UnregisterModel", model_name="slow") == 'Model "slow" unregistered'
    deadline = time.monotonic() + 60
    while api.processes() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert api.processes() - before == set(), "workers of the unregistered model are still running"
    assert api.broken(logged) == []
    assert "background worker update stopped: Model slow version 1.0 was unregistered" in "\n".join(api.server.output)
