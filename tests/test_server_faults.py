"""Faults on a real server: every accepted request gets exactly one answer, workers come back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from http_client import Reply, burst, call
from models import sleep_archive


def _workers(server) -> list[dict]:  # type: ignore[no-untyped-def]
    return call("GET", f"{server.management_url}/models/sleep").json()[0]["workers"]


def _wait_ready(server, count: int = 1, timeout: float = 60.0, not_pid: int = 0) -> list[dict]:  # type: ignore[no-untyped-def]
    """Wait until ``count`` workers are READY (and, with ``not_pid``, none of them is that old process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = _workers(server)
        ready = [w for w in workers if w["status"] == "READY" and w["pid"] != not_pid]
        if len(ready) >= count:
            return workers
        time.sleep(0.1)
    raise AssertionError(f"workers not ready: {_workers(server)}")


class Load:
    """Closed-loop clients that record every request they send and every answer they get."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url, self.stop = url, threading.Event()
        self.sent = 0
        self.replies: list[tuple[float, Reply | None]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client) for _ in range(clients)]

    def _client(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                self.sent += 1
            try:
                reply: Reply | None = call("POST", self.url, b"x", timeout=30)
            except OSError:
                reply = None
            with self.lock:
                self.replies.append((time.monotonic(), reply))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def test_kill_9_during_load_every_request_answered_once(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=20, model_config={"batchSize": 2, "maxBatchDelay": 5})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    old_pid = _wait_ready(server)[0]["pid"]
    with Load(f"{server.inference_url}/predictions/sleep") as load:
        time.sleep(1.5)
        os.kill(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        new = _wait_ready(server, not_pid=old_pid)
        time.sleep(2.0)
    assert new[0]["pid"] != old_pid and new[0]["restarts"] >= 1
    replies = [r for _, r in load.replies]
    assert len(replies) == load.sent  # exactly one answer per request: none hung, none lost
    assert all(r is not None for r in replies)
    statuses = [r.status for r in replies if r is not None]
    assert set(statuses) <= {200, 503}, set(statuses)
    assert statuses.count(200) > 20
    failed = [r for r in replies if r is not None and r.status == 503]
    assert all("Worker died" in r.json()["message"] or "no worker" in r.json()["message"] for r in failed)
    recovered = [r for t, r in load.replies if t > killed_at + 1.0 and r is not None]
    assert recovered and all(r.status == 200 for r in recovered[-10:])


def test_handler_exit_and_response_timeout(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=0, model_config={"responseTimeout": 1})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    url = f"{server.inference_url}/predictions/sleep"
    first = _wait_ready(server)[0]["pid"]

    died = call("POST", url, b"exit")
    assert died.status == 503 and "Worker died" in died.json()["message"]
    second = _wait_ready(server, not_pid=first)[0]["pid"]
    assert second != first and call("POST", url, b"ok").status == 200

    slow = call("POST", url, b"sleep:5")
    assert slow.status == 504 and slow.json()["type"] == "RequestTimeoutException"
    third = _wait_ready(server, not_pid=second)[0]["pid"]
    assert third != second and call("POST", url, b"ok").status == 200


def test_a_light_models_batches_sent_together_each_answered_once_when_its_worker_dies_among_them(
    tmp_path: Path,
    start_server,  # type: ignore[no-untyped-def]
) -> None:
    """A no-op-like model (batch 1): the batches already queued go to its worker in one write. A burst with
    requests that kill the worker: those get 503, every other its own answer, and none runs twice (the batches
    sent after the one that died had not started: they are queued again for the next worker)."""
    store, record = tmp_path / "store", tmp_path / "ran.txt"
    sleep_archive(store, batch_ms=0, model_config={"sleep": {"record": str(record)}})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    url = f"{server.inference_url}/predictions/sleep"
    for _ in range(10):  # the handler's time known: a light model's
        assert call("POST", url, b"warm").status == 200
    bodies = [b"b%d" % i for i in range(64)]
    for at in (50, 30, 10):  # three deaths: the batches sent with each depend on timing, so more than one chance
        bodies.insert(at, b"exit")
    replies = burst("POST", url, bodies)
    died = [r for b, r in zip(bodies, replies, strict=True) if b == b"exit"]
    by_body = {b: r for b, r in zip(bodies, replies, strict=True) if b != b"exit"}
    assert all(r.status == 503 and "Worker died" in r.json()["message"] for r in died)
    assert all(r.status == 200 and r.json()["echo"] == b.decode() for b, r in by_body.items()), [
        (b, r.status) for b, r in by_body.items() if r.status != 200
    ]
    ran = [line for line in record.read_text().splitlines() if line.startswith("b")]
    assert sorted(ran) == sorted(b.decode() for b in by_body)  # each ran once: none lost, none twice


def test_one_failing_item_does_not_fail_its_batch(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=0, model_config={"batchSize": 4, "maxBatchDelay": 300})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    replies = burst("POST", f"{server.inference_url}/predictions/sleep", [b"a", b"boom", b"c", b"d"])
    by_body = {b: r for b, r in zip((b"a", b"boom", b"c", b"d"), replies, strict=True)}
    assert by_body[b"boom"].status == 503 and by_body[b"boom"].json()["message"] == "Prediction failed"
    for body in (b"a", b"c", b"d"):
        assert by_body[body].status == 200 and by_body[body].json()["echo"] == body.decode()
    assert max(int(r.headers["x-servetune-batch-size"]) for r in replies) > 1


def test_load_failure_fails_registration_with_the_handlers_message(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, model_config={"sleep": {"fail_load": True}})
    server = start_server(model_store=store, properties={"enable_model_api": "true"})
    reply = call("POST", f"{server.management_url}/models?url=sleep.mar&initial_workers=1", timeout=120)
    assert reply.status == 500
    assert "cannot load: fail_load is set" in reply.json()["message"]
    assert call("GET", f"{server.management_url}/models").json() == {"models": []}


def test_crash_loop_is_reported(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    marker = tmp_path / "broken"
    # Spawned workers, each loading the model again: a worker forked from the model's parent gets the model as the
    # parent loaded it, and comes back whatever the marker says (tests/test_server_memory.py).
    config = {"workerPreload": "off", "sleep": {"fail_load_if_exists": str(marker)}}
    sleep_archive(store, model_config=config)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    pid = _wait_ready(server)[0]["pid"]
    assert call("GET", f"{server.inference_url}/ping").status == 200
    marker.write_text("")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = call("GET", f"{server.management_url}/models/sleep").json()[0]
        if info["health"]["crashLoop"]:
            break
        time.sleep(0.2)
    assert info["health"] == {"healthy": False, "crashLoop": True}
    assert info["workers"][0]["restarts"] >= 3
    ping = call("GET", f"{server.inference_url}/ping")
    assert ping.status == 500 and ping.json() == {"status": "Unhealthy"}
    # The fault cleared: the backoff loop brings the worker back by itself.
    marker.unlink()
    _wait_ready(server, timeout=60, not_pid=pid)
    assert call("GET", f"{server.inference_url}/ping").status == 200


def test_oversized_body_is_refused_with_413(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"}, properties={"max_request_size": "1000"})
    reply = call("POST", f"{server.inference_url}/predictions/sleep", b"x" * 5000)
    assert reply.status == 413 and reply.json()["type"] == "RequestEntityTooLargeException"
    assert call("POST", f"{server.inference_url}/predictions/sleep", b"x" * 900).status == 200


def test_sigterm_to_the_process_group_finishes_in_flight_requests(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM to the server and its workers at once (a terminal, systemd's control-group stop): the workers leave
    shutdown to the frontend, so the in-flight request is answered, no worker is restarted while the server stops,
    and nothing is left to log."""
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=1500)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    _wait_ready(server)
    results: list[Reply] = []
    sender = threading.Thread(
        target=lambda: results.append(call("POST", f"{server.inference_url}/predictions/sleep", b"in-flight"))
    )
    sender.start()
    time.sleep(0.5)
    for pid in server.worker_pids():
        os.kill(pid, signal.SIGTERM)
    assert server.stop(signal.SIGTERM) == 0
    sender.join(30)
    assert results and results[0].status == 200 and results[0].json()["echo"] == "in-flight"
    log = "\n".join(server.output)
    assert "restarting" not in log and "never retrieved" not in log and "[ERROR]" not in log, log[-3000:]


def test_workers_exit_when_the_frontend_is_killed(tmp_path: Path) -> None:
    """Spawned workers (PDEATHSIG), and a model's parent with the workers it forked (PDEATHSIG for the parent; each
    forked worker watches the frontend itself, as it outlives its parent otherwise)."""
    store = tmp_path / "store"
    sleep_archive(store)  # its handler mentions torch: forked from a parent
    sleep_archive(store, name="spawned", model_config={"workerPreload": "off"})
    config = tmp_path / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        "metrics_address=http://127.0.0.1:0\ndefault_workers_per_model=2\n"
        "disable_token_authorization=true\ngrpc_inference_port=0\ngrpc_management_port=0\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servetune",
            "serve",
            "--ts-config",
            str(config),
            "--model-store",
            str(store),
            "--models",
            "sleep=sleep.mar",
            "--models",
            "spawned=spawned.mar",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        with proc.stdout:
            for line in proc.stdout:
                if line.startswith("Model server started."):
                    break
            workers = psutil.Process(proc.pid).children(recursive=True)
            children = psutil.Process(proc.pid).children()
            assert len(workers) == 5 and len(children) == 3  # a parent with 2 workers, 2 spawned workers
            parent = next(c for c in children if "servetune.server.forkserver" in c.cmdline())
            assert len(parent.children()) == 2
    finally:
        proc.kill()  # the point of the test, and no stray server if it failed before that
        proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"orphan workers: {alive}"


def test_requests_of_disconnected_clients_never_reach_a_worker(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    record = tmp_path / "handled.txt"
    sleep_archive(store, batch_ms=0, model_config={"sleep": {"record": str(record)}})
    server = start_server(model_store=store, models={"sleep": "sleep.mar"})
    url = f"{server.inference_url}/predictions/sleep"
    _wait_ready(server)
    busy = threading.Thread(target=call, args=("POST", url, b"sleep:2"))
    busy.start()
    time.sleep(0.3)  # the only worker is now busy for 2 s
    try:
        call("POST", url, b"impatient", timeout=0.3)
    except OSError:
        pass  # the client gave up and closed its connection
    assert call("POST", url, b"patient").status == 200
    busy.join()
    handled = record.read_text().split()
    assert "patient" in handled and "impatient" not in handled


# A handler that breaks the worker's one-answer-per-request invariant on purpose: it wraps the worker runtime's own
# Service.predict (inside the real worker process) to drop the last answer of any batch that asks for it.
BROKEN_REPLY_HANDLER = """
import servetune.handlers.service as service

_predict = service.Service.predict


def _short(self, batch):
    answers = _predict(self, batch)
    if any(r.inputs and bytes(r.inputs[0].data) == b"short" for r in batch):
        return answers[:-1]
    return answers


service.Service.predict = _short


def handle(data, context):
    if data is None:
        return None
    return [{"batch": len(data)} for _ in data]
"""


def test_a_reply_with_the_wrong_number_of_results_fails_its_batch_and_the_slot_keeps_serving(
    tmp_path: Path,
    start_server,  # type: ignore[no-untyped-def]
) -> None:
    from servetune.archive import create_archive

    src = tmp_path / "src"
    src.mkdir()
    (src / "short_handler.py").write_text(BROKEN_REPLY_HANDLER)
    (src / "model-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 300\nresponseTimeout: 30\n")
    store = tmp_path / "store"
    store.mkdir()
    create_archive(
        model_name="short",
        version="1.0",
        handler=str(src / "short_handler.py"),
        config_file=str(src / "model-config.yaml"),
        export_path=str(store),
    )
    server = start_server(model_store=store, models={"short": "short.mar"})
    url = f"{server.inference_url}/predictions/short"

    started = time.monotonic()
    replies = burst("POST", url, [b"short", b"short", b"short"])
    assert time.monotonic() - started < 30, "the batch must be answered, not left to time out"
    assert [r.status for r in replies] == [503, 503, 503], [r.body for r in replies]
    for reply in replies:
        assert reply.json()["type"] == "ServiceUnavailableException"
        assert "answered 2 results for a batch of 3 requests" in reply.json()["message"]
    assert _workers_of(server, "short")[0]["status"] == "READY"
    after = burst("POST", url, [b"fine", b"fine"])
    assert [r.status for r in after] == [200, 200], [r.body for r in after]
    assert {r.json()["batch"] for r in after} <= {1, 2}


def _workers_of(server, model: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return call("GET", f"{server.management_url}/models/{model}").json()[0]["workers"]


def test_an_embedded_server_interrupted_while_it_starts_is_stopped(tmp_path: Path) -> None:
    """Ctrl-C (or a tuner's SIGTERM, which the CLI turns into one) while the server starts: nothing is left running
    (a benchmark's tuner killed at that moment left a server and its workers behind)."""
    from servetune.embedded import EmbeddedServer

    sleep_archive(tmp_path / "store", batch_ms=1)
    server = EmbeddedServer(tmp_path / "store", {"sleep": "sleep.mar"}, {"disable_token_authorization": "true"},
                            workdir=tmp_path / "server")  # fmt: skip

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        try:
            server.start()
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the server started within 0.5 s: nothing was interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert server.proc is not None and server.proc.poll() is not None, "the server outlived the interrupted start"


def _serve(tmp_path: Path, store: Path, models: list[str], workers: int = 2) -> subprocess.Popen[str]:
    config = tmp_path / "config.properties"
    config.write_text(
        "inference_address=http://127.0.0.1:0\nmanagement_address=http://127.0.0.1:0\n"
        f"metrics_address=http://127.0.0.1:0\ndefault_workers_per_model={workers}\n"
        "disable_token_authorization=true\ngrpc_inference_port=0\ngrpc_management_port=0\n"
    )
    command = [sys.executable, "-m", "servetune", "serve", "--ts-config", str(config), "--model-store", str(store)]
    for model in models:
        command += ["--models", model]
    return subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigterm_while_the_workers_start_and_die_stops_the_server(tmp_path: Path) -> None:
    """SIGTERM to a server while a start-up model still loads (for a minute), and SIGKILL to another model's serving
    workers in the same instant (a node drained while the pod starts): the server stops at once, without waiting
    for the load (Kubernetes kills a pod 30 s after its SIGTERM), restarts no worker, and leaves none behind."""
    store = tmp_path / "store"
    sleep_archive(store, model_config={"workerPreload": "off"})
    sleep_archive(store, name="slow", model_config={"workerPreload": "off", "sleep": {"load_s": 60.0}})
    proc = _serve(tmp_path, store, ["sleep=sleep.mar", "slow=slow.mar"])
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith('Model "sleep"') for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        management = next(line.split()[-1] for line in lines if line.startswith("Management API bound to"))
        serving = [w["pid"] for w in call("GET", f"{management}/models/sleep").json()[0]["workers"]]
        assert len(serving) == 2 and not any(line.startswith("Model server started.") for line in lines)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        for pid in serving:
            os.kill(pid, signal.SIGKILL)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the server did not stop within 30 s of SIGTERM") from None
        reader.join(10)
        output = "".join(lines)
        assert proc.returncode == 0 and "Model server stopped." in output, output[-3000:]
        assert "stopping while its models load" in output and "Model server started." not in output, output[-3000:]
        _, alive = psutil.wait_procs(descendants, timeout=10)
        assert not alive, f"left running: {alive}"
    finally:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
