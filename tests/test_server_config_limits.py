"""Configuration robustness on real servers (issue 19, items 4-6, 8 and 10's configuration part): any model-config.yaml
either becomes what the worker gets or is refused with a 400 naming the key; YAML alias expansion is limited and
archive work stays off the event loop; one bound per setting from every source (archive, ``models=``, REST, gRPC);
integers read as Java's ``Integer.parseInt``; TorchServe's model-name rule; handlers only from inside the archive; a
failed registration leaves nothing registered; failing start-up models leave the server running, naming them.

One server for the management checks (``max_workers_per_model=2``), one for the start-up models.
"""

from __future__ import annotations

import json
import os
import statistics
import textwrap
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from conftest import RunningServer
from grpc_models import generate_stubs
from http_client import call
from models import CHAIN, ECHO_HANDLER, LAUGHS, SLEEP_HANDLER, handler_archive, sleep_archive, yaml_archive

# A handler outside every archive, in the server's working directory: importing it leaves a mark.
OUTSIDE_HANDLER = textwrap.dedent(
    """
    import pathlib

    pathlib.Path(__file__).with_name("outside-imported").write_text("ran")

    def handle(data, context):
        return None if data is None else ["outside" for _ in data]
    """
)

REFUSED_YAML = {  # archive name -> (model-config.yaml, what the 400 names)
    "date": ("released: 2024-01-01\n", "key 'released': 2024-01-01 is a YAML date"),
    "binary": ("blob: !!binary aGVsbG8=\n", "key 'blob': a !!binary value"),
    "aset": ("tags: !!set {a, b}\n", "key 'tags': a !!set"),
    "selfref": ("handler:\n  loop: &x [1, *x]\n", "key 'handler.loop[1]': the value contains itself"),
    "intkey": ("labels: {0: cat, 1: dog}\n", "key 0 under 'labels': mapping keys must be strings"),
    "baddate": ("when: 2024-13-45\n", "invalid YAML: month must be in 1..12"),
    "deep": ("a: " + "[" * 60 + "]" * 60 + "\n", "nested more than 50 levels deep"),
    "large": ("blob: '" + "x" * 70_000 + "'\n", "model-config.yaml is larger than the limit of 65536 bytes"),
    "laughs": (LAUGHS, "more than 50 aliases of lists or mappings"),
    "chain": (CHAIN, "expands to more than 65536 bytes as JSON"),
}


def directory_model(store: Path, folder: str, name: str, handler: str) -> None:
    """A directory model (TorchServe's no-archive format) whose manifest says what the test needs."""
    (store / folder / "MAR-INF").mkdir(parents=True)
    (store / folder / "echo.py").write_text(ECHO_HANDLER)
    manifest = {"runtime": "python", "model": {"modelName": name, "modelVersion": "1.0", "handler": handler}}
    (store / folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("store")
    for name, (text, _) in REFUSED_YAML.items():
        yaml_archive(store, name, text)
    yaml_archive(store, "minw", "minWorkers: 3\nmaxWorkers: 3\n")
    yaml_archive(store, "bigbatch", "batchSize: 2000000\n")
    yaml_archive(store, "pinned", "minWorkers: 1\nnumThreads: 4096\ncpuPinning: true\n")
    yaml_archive(store, "failload", "sleep: {fail_load: true}\n", SLEEP_HANDLER)
    sleep_archive(store, batch_ms=0)
    handler_archive(store, "heavy", "echo.py", ECHO_HANDLER + "\nPAD = " + repr(os.urandom(1 << 22).hex()) + "\n", {})
    directory_model(store, "badname", "bad name", "echo.py")
    directory_model(store, "escape", "escape", "../../elsewhere/x.py")
    directory_model(store, "missing", "missing", "nothere.py")
    workdir = tmp_path_factory.mktemp("server")
    (workdir / "x.py").write_text(OUTSIDE_HANDLER)  # the server's (and its workers') working directory
    props = {
        "disable_token_authorization": "true",
        "enable_model_api": "true",
        "max_workers_per_model": "2",
        "default_workers_per_model": "0",
    }
    running = RunningServer(store, None, props, workdir=workdir, startup_timeout=120, fail_on_model_error=False)
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def grpc_management(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    stubs: dict[str, ModuleType] = generate_stubs(tmp_path_factory.mktemp("stubs"))
    with grpc.insecure_channel(server.grpc_management_target) as channel:
        yield stubs["management_pb2"], stubs["management_pb2_grpc"].ManagementAPIsServiceStub(channel)


def register(server: RunningServer, query: str, timeout: float = 60.0) -> tuple[int, Any]:
    reply = call("POST", f"{server.management_url}/models?{query}", timeout=timeout)
    return reply.status, reply.json()


def registered(server: RunningServer) -> list[str]:
    return [m["modelName"] for m in call("GET", f"{server.management_url}/models").json()["models"]]


def healthy(server: RunningServer) -> bool:
    reply = call("GET", f"{server.inference_url}/ping")
    return reply.status == 200 and reply.json() == {"status": "Healthy"}


# ---- item 5: YAML values, and failed registrations ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REFUSED_YAML))
def test_yaml_a_worker_cannot_take_is_refused_naming_the_key(server: RunningServer, name: str) -> None:
    status, body = register(server, f"url={name}.mar&initial_workers=1", timeout=30)
    assert status == 400, body
    assert REFUSED_YAML[name][1] in body["message"] and f"{name}.mar" in body["message"], body
    assert name not in registered(server)
    assert healthy(server)


def test_a_failed_registration_leaves_nothing_registered(server: RunningServer) -> None:
    # the placement refuses 4096 pinned cores after the version was added: a 400, and the version is gone
    status, body = register(server, "url=pinned.mar")
    assert status == 400 and "pinned" not in registered(server), body
    # a handler that cannot load: 500, and the version is gone
    status, body = register(server, "url=failload.mar&initial_workers=1")
    assert status == 500 and "cannot load: fail_load is set" in body["message"], body
    assert "failload" not in registered(server)
    assert healthy(server)


# ---- item 4 (YAML part): no API waits while an archive is read ------------------------------------------------------


def test_ping_stays_responsive_while_heavy_archives_register(server: RunningServer) -> None:
    """The billion laughs, the alias chain and an archive of 8 MiB register while another client pings."""
    pings: list[float] = []
    stop = threading.Event()

    def ping() -> None:
        while not stop.is_set():
            start = time.monotonic()
            assert call("GET", f"{server.inference_url}/ping", timeout=30).status == 200
            pings.append(time.monotonic() - start)
            time.sleep(0.01)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        time.sleep(0.1)
        for _ in range(3):
            assert register(server, "url=laughs.mar&initial_workers=1", timeout=30)[0] == 400
            assert register(server, "url=chain.mar&initial_workers=1", timeout=30)[0] == 400
            assert register(server, "url=heavy.mar&initial_workers=0", timeout=30)[0] == 200
            assert call("DELETE", f"{server.management_url}/models/heavy").status == 200
        time.sleep(0.1)
    finally:
        stop.set()
        pinger.join()
    assert len(pings) >= 10, pings
    assert statistics.median(pings) < 0.25 and max(pings) < 1.0, (statistics.median(pings), max(pings))


# ---- item 6: one bound for every source of a setting ----------------------------------------------------------------


def test_worker_and_batch_limits_are_the_same_from_every_source(server: RunningServer, grpc_management: Any) -> None:
    workers = "must be between 0 and 2, got 3 (max_workers_per_model=2)"
    status, body = register(server, "url=minw.mar")
    assert (status, body["message"]) == (400, f"minw.mar: model-config.yaml: minWorkers {workers}")
    status, body = register(server, "url=sleep.mar&initial_workers=3")
    assert (status, body["message"]) == (400, f"initial_workers {workers}")
    status, body = register(server, "url=bigbatch.mar")
    assert (status, body["message"]) == (
        400,
        "bigbatch.mar: model-config.yaml: batchSize must be between 1 and 1000000, got 2000000",
    )
    status, body = register(server, "url=sleep.mar&batch_size=2000000")
    assert (status, body["message"]) == (400, "batch_size must be between 1 and 1000000, got 2000000")

    pb, stub = grpc_management
    with pytest.raises(grpc.RpcError) as refused:
        stub.RegisterModel(pb.RegisterModelRequest(url="sleep.mar", initial_workers=3, synchronous=True), timeout=60)
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"initial_workers {workers}",
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub.RegisterModel(pb.RegisterModelRequest(url="minw.mar", synchronous=True), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == f"minw.mar: model-config.yaml: minWorkers {workers}"

    status, body = register(server, "url=sleep.mar&initial_workers=0")
    assert status == 200, body
    scaled = call("PUT", f"{server.management_url}/models/sleep?min_worker=3&synchronous=true")
    assert (scaled.status, scaled.json()["message"]) == (400, f"min_worker {workers}")
    with pytest.raises(grpc.RpcError) as refused:
        stub.ScaleWorker(pb.ScaleWorkerRequest(model_name="sleep", min_worker=3, synchronous=True), timeout=60)
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"min_worker {workers}",
    )
    assert call("DELETE", f"{server.management_url}/models/sleep").status == 200


# ---- item 8: integers as Integer.parseInt reads them; model names ---------------------------------------------------


def test_management_integers_are_read_as_java_reads_them(server: RunningServer) -> None:
    mgmt = server.management_url
    status, body = register(server, "url=sleep.mar&initial_workers=0&batch_size=1_0")
    assert status == 200, body
    assert call("GET", f"{mgmt}/models/sleep").json()[0]["batchSize"] == 1  # 1_0 is not an integer: not given

    def max_workers_after(value: str) -> int:
        """``max_worker`` is read, with ``min_worker=0`` (no worker starts); not given, it is ``min_worker``."""
        reply = call("PUT", f"{mgmt}/models/sleep?min_worker=0&max_worker={value}&synchronous=true")
        assert reply.status == 200, (value, reply.body)
        return int(call("GET", f"{mgmt}/models/sleep").json()[0]["maxWorkers"])

    # Integer.parseInt refuses each of these, so each is "not given" (Arabic-Indic ٢: see docs/limits.md)
    for value in ("1_0", "%202", "2%20", "2147483648", "%D9%A2", "0x2", "2.0", ""):
        assert max_workers_after(value) == 0, value
    assert max_workers_after("%2B2") == 2  # a sign is Java's too
    assert max_workers_after("002") == 2
    # servetune's own integers: strict, and a 400 (never a 500) for a number of 400 digits
    strict = call("PUT", f"{mgmt}/models/sleep?batch_size=1_0")
    assert (strict.status, strict.json()["message"]) == (400, "batch_size must be an integer, got '1_0'")
    huge = call("PUT", f"{mgmt}/models/sleep?min_worker=0&synchronous=true&timeout={'9' * 400}")
    assert huge.status == 400 and huge.json()["message"].startswith("timeout must be between 1 and 1000000"), huge.body
    assert call("PUT", f"{mgmt}/models/sleep?min_worker=0&synchronous=true&timeout=-1").status == 200
    assert call("DELETE", f"{mgmt}/models/sleep").status == 200


@pytest.mark.parametrize(
    "name",
    ["a/b", "a\nb", "\u202eab", ".hidden", "a b", "-a"],
    ids=["slash", "newline", "right-to-left-override", "leading-dot", "space", "leading-dash"],
)
def test_model_names_follow_torchserve_rule(server: RunningServer, name: str) -> None:
    status, body = register(server, f"url=sleep.mar&model_name={urllib.parse.quote(name)}")
    assert status == 400 and "invalid model name" in body["message"], body
    assert registered(server) == []


def test_model_names_from_archives_and_grpc_follow_the_rule(server: RunningServer, grpc_management: Any) -> None:
    status, body = register(server, "url=badname")
    assert status == 400 and "invalid model name 'bad name'" in body["message"], body
    pb, stub = grpc_management
    with pytest.raises(grpc.RpcError) as refused:
        stub.RegisterModel(pb.RegisterModelRequest(url="sleep.mar", model_name="a/b", synchronous=True), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "invalid model name" in refused.value.details()
    assert registered(server) == []


# ---- item 10: handlers from inside the archive only; url=. ----------------------------------------------------------


def test_a_handler_outside_the_archive_is_refused(server: RunningServer) -> None:
    escape = urllib.parse.quote("../../elsewhere/x.py")
    for query, says in (
        (f"url=sleep.mar&initial_workers=1&handler={escape}", "must name a file inside the archive"),
        ("url=escape&initial_workers=1", "must name a file inside the archive"),
        ("url=missing&initial_workers=1", "names nothere.py, which the archive does not contain"),
        ("url=sleep.mar&initial_workers=1&handler=x.py", "names x.py, which the archive does not contain"),
    ):
        status, body = register(server, query)
        assert status == 400 and says in body["message"], (query, body)
    assert registered(server) == []
    assert not (server.workdir / "outside-imported").exists(), "a handler outside the archive was imported"


@pytest.mark.parametrize("url", [".", "./", "%2E"])
def test_the_model_store_itself_is_not_a_model(server: RunningServer, url: str) -> None:
    status, body = register(server, f"url={url}")
    assert status == 400 and "names the model store itself" in body["message"], body
    assert registered(server) == []


def test_the_model_store_by_its_absolute_path_is_not_a_model(server: RunningServer) -> None:
    assert server.model_store is not None
    status, body = register(server, f"url={urllib.parse.quote(str(server.model_store))}")
    assert status == 400 and "names the model store itself" in body["message"], body


# ---- item 5: start-up models ----------------------------------------------------------------------------------------


def test_failing_startup_models_leave_the_server_running_and_name_them(tmp_path: Path, start_server: Any) -> None:
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=0)
    yaml_archive(store, "anchors", "base: &b {threshold: 0.5, labels: [cat, dog]}\nhandler:\n  <<: *b\n  top: 3\n")
    yaml_archive(store, "date", "released: 2024-01-01\n")
    yaml_archive(store, "laughs", LAUGHS)
    properties = {"max_workers_per_model": "2", "models": json.dumps({"cfgw": {"1.0": {"minWorkers": 5}}})}
    models = {"good": "anchors.mar", "date": "date.mar", "laughs": "laughs.mar", "cfgw": "sleep.mar"}
    models["a/b"] = "sleep.mar"
    server = start_server(model_store=store, models=models, properties=properties)
    assert server.proc is not None and server.proc.poll() is None, "the server must keep running"
    ping = call("GET", f"{server.inference_url}/ping")
    assert ping.status == 500 and ping.json()["status"] == "Unhealthy"
    failed = ping.json()["failedModels"]
    assert sorted(failed) == ["a/b", "cfgw", "date", "laughs"], failed
    assert "key 'released'" in failed["date"] and "aliases" in failed["laughs"]
    assert failed["cfgw"] == "models[cfgw][1.0]: minWorkers must be between 0 and 2, got 5 (max_workers_per_model=2)"
    assert "invalid model name 'a/b'" in failed["a/b"]
    # the model that loaded serves, its YAML anchors and merge keys expanded in what its handler was given
    answer = call("POST", f"{server.inference_url}/predictions/good", b"x")
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["handler"] == {"labels": ["cat", "dog"], "threshold": 0.5, "top": 3}
