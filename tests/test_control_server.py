"""The online controller on a real server, with known-cost models (a sleep of a + b·n ms per batch of n) whose right
answers are computed by hand (tests/test_control_law.py checks the law itself): the knobs after a load step, shedding,
no request lost or duplicated across knob changes, the decision log against the metrics and the answers, and
settings refused at registration naming the key."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from http_client import Reply, call, wait_for
from models import sleep_archive, yaml_archive
from servetune.control.controller import MIN_SHED_BATCHES
from servetune.control.law import SLACK_MS
from servetune.control.slo_policy import HOLD_S
from servetune.embedded import EmbeddedServer
from servetune.hardware import physical_cores

STEP = {  # a = 20 ms, b = 5 ms, SLA P99 200 ms: at 20 req/s 1 worker, batch 15, no delay; at 150 2 workers, batch 22
    "batchSize": 8,
    "controller": {
        "slo": {"p99_ms": 200},
        "bounds": {"batch_size": [1, 32], "max_batch_delay_ms": [0, 100], "workers": [1, 2]},
    },
}
SHED = {  # 100 ms a request, one at a time: the third of a burst cannot make 280 ms
    "controller": {
        "slo": {"p99_ms": 280},
        "bounds": {"batch_size": [1, 1], "max_batch_delay_ms": [0, 0]},
        "shed": True,
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    tmp = tmp_path_factory.mktemp("control")
    store = tmp / "store"
    step = {**STEP, "controller": {**STEP["controller"], "log": str(tmp / "logs" / "step.jsonl")}}
    sleep_archive(store, "step", batch_ms=20, item_ms=5, model_config=step)
    shed = {"controller": {**SHED["controller"], "log": str(tmp / "logs" / "shed.jsonl")}}
    sleep_archive(store, "shed", batch_ms=100, model_config=shed)
    logged: dict[str, Any] = {
        "controller": {
            "slo": {"p99_ms": 500},
            "bounds": {"batch_size": [1, 8], "max_batch_delay_ms": [0, 20]},
            "log": str(tmp / "logs" / "logged.jsonl"),
        }
    }
    logged["sleep"] = {"record": str(tmp / "rec")}
    sleep_archive(store, "logged", batch_ms=5, item_ms=1, model_config=logged)
    sleep_archive(store, "plain", batch_ms=300)  # no controller
    held = {"batchSize": 8, "controller": {**STEP["controller"], "log": str(tmp / "logs" / "held.jsonl")}}
    sleep_archive(store, "held", batch_ms=20, item_ms=5, model_config=held)
    properties = {"disable_token_authorization": "true", "default_workers_per_model": "1", "enable_model_api": "true"}
    models = {"step": "step.mar", "shed": "shed.mar", "logged": "logged.mar", "plain": "plain.mar", "held": "held.mar"}
    with EmbeddedServer(store, models, properties, workdir=tmp / "server") as running:
        running.tmp = tmp  # type: ignore[attr-defined]
        yield running


def describe(server: EmbeddedServer, model: str) -> dict[str, Any]:
    reply = call("GET", f"{server.management_url}/models/{model}")
    assert reply.status == 200, reply.body
    controller: dict[str, Any] = reply.json()[0]["controller"]
    return controller


def predict(server: EmbeddedServer, model: str, body: bytes, headers: dict[str, str] | None = None) -> Reply:
    return call("POST", f"{server.inference_url}/predictions/{model}", body, headers)


def open_loop(
    server: EmbeddedServer, model: str, phases: list[tuple[float, float]], pool: ThreadPoolExecutor
) -> tuple[list[Future[Reply]], list[float]]:
    """Send at ``rate`` req/s for ``seconds``, phase after phase, on time (each request on its own thread); returns
    the replies to come and when each phase began (time.monotonic())."""
    futures: list[Future[Reply]] = []
    starts = []
    t = time.monotonic()
    for seconds, rate in phases:
        starts.append(t)
        for i in range(int(seconds * rate)):
            at = t + i / rate
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(predict, server, model, f"r{len(futures)}".encode()))
        t += seconds
    return futures, starts


def test_after_a_load_step_the_knobs_settle_where_the_cost_says(server: EmbeddedServer) -> None:
    samples: list[tuple[float, dict[str, Any]]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            samples.append((time.monotonic(), describe(server, "step")["knobs"]))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    with ThreadPoolExecutor(64) as pool:
        watcher.start()
        try:
            futures, (_, step_at) = open_loop(server, "step", [(2.5, 20.0), (3.0, 150.0)], pool)
            replies = [f.result() for f in futures]
        finally:
            done.set()
            watcher.join()
    assert {r.status for r in replies} == {200}
    before = [k for t, k in samples if step_at - 0.5 < t < step_at]
    # by hand: one worker at 20 req/s, no delay, batch 15 (2 (20 + 5n) <= 198); evenly spaced requests mostly run
    # alone, so b is told from a few batches of two, if at all (then the batch size stays as registered, 8), and
    # the cap stays within twice the largest batch seen: never above the SLA's, never at the bound (32)
    assert before and all(k["max_batch_delay_ms"] == 0 and k["workers"] == 1 for k in before), before
    assert all(k["batch_size"] <= 8 for k in before), before
    reacted = next(t for t, k in samples if t > step_at and k["workers"] == 2)
    assert reacted - step_at <= 1.5  # a meter window (0.5 s) and a tick (0.1 s), with a loaded machine's slack
    settled = [k for t, k in samples if t > step_at + 1.5]
    # by hand at 150 req/s: one worker at batch 15 carries 15 / 95 ms = 158 req/s, under rho = 0.8 126: two workers,
    # whose cap is 1.5 (20 + 5n) <= 198 -> 22 (the fit sees the frontend's own ms on top of the sleep: a band below),
    # or twice the largest batch measured when that is less (the batches the step's backlog formed)
    largest = describe(server, "step")["fit"]["largest"]
    assert all(k["batch_size"] <= min(22, 2 * largest) for k in settled), (settled, largest)
    assert all(k["max_batch_delay_ms"] == 0 and k["workers"] == 2 for k in settled), settled
    # no flapping once settled: the cap may grow (as the fit learns larger batches), and come down only when the cap
    # now is predicted to miss the SLA (the fit's cautious cost rose: a host that slowed) or the law has asked for a
    # lower one for HOLD_S; never back to a cap it left
    caps = [c for i, c in enumerate(k["batch_size"] for k in settled) if i == 0 or c != settled[i - 1]["batch_size"]]
    assert len(caps) == len(set(caps)), caps
    time.sleep(0.3)  # the log is flushed every tick
    tmp: Path = server.tmp  # type: ignore[attr-defined]
    changes = [json.loads(line) for line in (tmp / "logs" / "step.jsonl").read_text().splitlines()]
    lowered = [r for r in changes if r["kind"] == "knobs" and r["new"]["batch_size"] < r["old"]["batch_size"]]
    for record in lowered:  # every cap the law lowered (not the start's guesses): a sure miss, or asked for HOLD_S
        if "law" in record["why"]:
            down = record["why"]["cap_down"]
            assert down["worst_ms"] > 200 - SLACK_MS if down["sure_miss"] else down["asked_s"] >= HOLD_S, record
    # where it settles: a larger cap that the load does not need waits HOLD_S, so it may come after the trace (the
    # two workers stay for WORKERS_HOLD_S). The cap is the law's for the workers that collect: both while the load
    # runs, 1.5 (20 + 5n) <= 198 -> 22, and with a margin of at most 15% of the SLA 1.5 (20 + 5n) <= 168 -> 17 at the
    # least; once the load has fallen (HOLD_S after the trace) one of them waits in reserve and the one that collects
    # has 2 (20 + 5n) <= 198 -> 15, with the margin 2 (20 + 5n) <= 168 -> 11 at the least (a slow host's CI runs got
    # there before the two workers' cap had climbed into its band)
    bands = {2: (17, 22), 1: (11, 15)}
    seen: list[Any] = []

    def in_band() -> bool:
        state = describe(server, "step")
        knobs = state["knobs"]
        collecting = knobs["workers"] - state["reserveWorkers"]
        low, high = (min(end, 2 * largest) for end in bands[collecting])
        seen[:] = [knobs, state["reserveWorkers"], state["fit"]]
        return low <= knobs["batch_size"] <= high

    # (10 s: on a slow, loaded host the fit's margin takes longer to narrow; 4 s missed once in a CI run)
    try:
        wait_for(in_band, 10, f"the cap of the workers that collect, in {bands}")
    except AssertionError as exc:  # what the law had then, and the fit it had it from
        raise AssertionError(f"{exc}; knobs, reserve and fit: {seen}") from None
    # Whether P99 stays inside the SLA after the step is a latency figure of this host (a slow shared machine made
    # 41 of 500 late with the right knobs): benchmarks/controller_vs_baselines.py measures it, a test does not.


def test_a_worker_held_after_the_load_fell_waits_in_reserve_and_leaves_the_batches_to_the_other(
    server: EmbeddedServer,
) -> None:
    """The STEP model: at 150 req/s two workers collect batches; the load back at 20 req/s, the law wants one, and the
    second is held for WORKERS_HOLD_S, in reserve after HOLD_S: every batch then runs on the first worker, none is
    due at its deadline (one worker at 20 req/s: batches of ~25 ms, against 200 ms), and describe and the metrics
    say so."""
    tmp: Path = server.tmp  # type: ignore[attr-defined]
    with ThreadPoolExecutor(64) as pool:
        futures, _ = open_loop(server, "held", [(2.5, 150.0), (4.0, 20.0)], pool)
        assert describe(server, "held")["reserveWorkers"] == 1
        assert metric_values(server, "servetune_controller_reserve_workers", "held") == {"": 1.0}
        replies = [f.result() for f in futures]
    assert {r.status for r in replies} == {200}
    time.sleep(0.3)  # the log is flushed every tick
    lines = [json.loads(line) for line in (tmp / "logs" / "held.jsonl").read_text().splitlines()]
    changes = [r for r in lines if r["kind"] == "knobs"]
    # the last worker put in reserve: after the load fell (one may be started in reserve as the load climbs, for
    # the headroom of 15% more load)
    held = [r for r in changes if r["new"]["reserve"] == 1 and r["old"]["reserve"] == 0][-1]
    assert held["new"]["workers"] == 2 and held["old"]["reserve"] == 0 and held["why"]["reserve"] == 1
    batches = [r for r in lines if r["kind"] == "batch"]
    before = {b["worker"] for b in batches if b["t"] < held["t"]}
    after = [b for b in batches if b["t"] > held["t"] + 0.2]
    assert len(before) == 2  # both collected while the load needed them
    assert after and {b["worker"] for b in after} == {"9000"} and not [b for b in after if b["reason"] == "reserve"]


def test_shedding_answers_503_at_once_to_what_cannot_make_it_and_serves_what_can(server: EmbeddedServer) -> None:
    for i in range(MIN_SHED_BATCHES):  # the fit learns t(1) = 100 ms; a cold model sheds nothing meanwhile
        assert predict(server, "shed", f"warm{i}".encode()).status == 200
    wait_for(lambda: describe(server, "shed")["fit"]["batches"] >= MIN_SHED_BATCHES, 5, "the warm-up fitted")

    def timed(body: bytes) -> tuple[Reply, float]:
        started = time.monotonic()
        reply = predict(server, "shed", body)
        return reply, time.monotonic() - started

    barrier = threading.Barrier(6)

    def sync(i: int) -> tuple[Reply, float]:
        barrier.wait()
        return timed(f"b{i}".encode())

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(sync, range(6)))
    served = [(r, s) for r, s in results if r.status == 200]
    shed = [(r, s) for r, s in results if r.status == 503]
    assert len(served) + len(shed) == 6
    assert len(served) >= 2 and len(shed) >= 2  # 100, 200 ms make 280 ms (80 to spare); 300 ms cannot
    for reply, seconds in shed:
        assert seconds < 0.5, seconds  # at once, not after waiting its turn (300 ms and more)
        assert int(reply.headers["retry-after"]) >= 1
        assert "deadline" in reply.json()["message"]
    for reply, _ in served:
        assert float(reply.headers["x-servetune-queue-ms"]) + float(reply.headers["x-servetune-handler-ms"]) < 280
    assert describe(server, "shed")["shed"] >= len(shed)

    # the client's own deadline: 50 ms cannot hold a 100 ms model even when it is idle; 1 s can
    time.sleep(0.4)
    started = time.monotonic()
    tight = predict(server, "shed", b"tight", {"x-servetune-timeout-ms": "50"})
    assert tight.status == 503 and time.monotonic() - started < 0.5
    assert predict(server, "shed", b"loose", {"x-servetune-timeout-ms": "1000"}).status == 200
    assert predict(server, "shed", b"bad", {"x-servetune-timeout-ms": "soon"}).status == 400
    # the Open Inference Protocol's own: a ``timeout`` parameter, in microseconds
    oip = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1]}], "parameters": {"timeout": 50000}}
    started = time.monotonic()
    url = f"{server.inference_url}/v2/models/shed/infer"
    refused = call("POST", url, json.dumps(oip).encode(), {"Content-Type": "application/json"})
    assert refused.status == 503 and time.monotonic() - started < 0.5, refused.body
    assert "deadline" in refused.json()["error"]
    # each refusal is in the decision log with the prediction that refused it: the burst's against the SLA (280 ms),
    # the clients' own against theirs (50 ms)
    time.sleep(0.3)  # the log is flushed every tick
    tmp: Path = server.tmp  # type: ignore[attr-defined]
    lines = [json.loads(line) for line in (tmp / "logs" / "shed.jsonl").read_text().splitlines()]
    refusals = [r for r in lines if r["kind"] == "shed"]
    assert len(refusals) == len(shed) + 2
    assert sum(not r["own"] for r in refusals) == len(shed)
    for r in refusals:
        assert r["predicted_ms"] + r["margin_ms"] + 2.0 > r["room_ms"]  # the rule that refused it
        assert r["room_ms"] <= (50.0 if r["own"] else 280.0)


def test_a_deadline_that_passes_in_the_queue_is_answered_504_at_the_deadline(server: EmbeddedServer) -> None:
    # one worker, busy for a second (300 ms and 0.7 s more) with a request of no deadline; two requests with 100 ms
    # each wait behind it: they get a clear 504 at their deadline, not when the worker frees, nor a late answer
    def timed(body: bytes, headers: dict[str, str]) -> tuple[Reply, float]:
        started = time.monotonic()
        reply = predict(server, "plain", body, headers)
        return reply, time.monotonic() - started

    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(timed, b"sleep:0.7", {})
        time.sleep(0.3)  # the busy request has reached the worker
        waiting = [pool.submit(timed, b"%d" % i, {"x-servetune-timeout-ms": "100"}) for i in range(2)]
        late = [f.result() for f in waiting]
        served, served_s = busy.result()
    assert served.status == 200 and served_s >= 0.95
    for reply, seconds in late:
        assert reply.status == 504, reply.body
        assert seconds < 0.5, seconds  # at the deadline (100 ms), while the worker is still busy
        body = reply.json()
        assert body["type"] == "RequestTimeoutException" and "deadline" in body["message"]


def metric_values(server: EmbeddedServer, name: str, model: str) -> dict[str, float]:
    text = call("GET", f"{server.metrics_url}/metrics").body.decode()
    found = {}
    for line in text.splitlines():
        if line.startswith(name) and f'model_name="{model}"' in line:
            labels, value = line.rsplit(" ", 1)
            reason = labels.partition('reason="')[2].partition('"')[0]
            found[reason] = float(value)
    return found


def test_the_decision_log_and_the_metrics_agree_with_what_the_worker_did(server: EmbeddedServer) -> None:
    tmp: Path = server.tmp  # type: ignore[attr-defined]
    with ThreadPoolExecutor(32) as pool:
        futures, _ = open_loop(server, "logged", [(1.0, 60.0), (1.0, 200.0)], pool)
        replies = [f.result() for f in futures]
    assert {r.status for r in replies} == {200}
    wait_for(lambda: sum(metric_values(server, "servetune_controller_batches_total", "logged").values()) > 0, 5, "m")
    time.sleep(0.3)  # the log is flushed every tick
    lines = [json.loads(line) for line in (tmp / "logs" / "logged.jsonl").read_text().splitlines()]
    batches = [r for r in lines if r["kind"] == "batch"]
    # every request ran in exactly one logged batch, of the size its answer reports
    assert sum(b["size"] for b in batches) == len(replies)
    sizes = Counter(int(r.headers["x-servetune-batch-size"]) for r in replies)
    assert Counter(b["size"] for b in batches) == Counter({n: count // n for n, count in sizes.items()})
    # the metrics count the same batches by the same reasons
    by_reason = Counter(b["reason"] for b in batches)
    metrics = metric_values(server, "servetune_controller_batches_total", "logged")
    assert {k: v for k, v in metrics.items() if v} == {k: float(v) for k, v in by_reason.items()}
    assert all(b["reason"] in ("full", "delay", "deadline") for b in batches)
    assert all(b["actual_ms"] >= 5.0 + b["size"] for b in batches)  # the sleep itself
    fitted = [b for b in batches if b["predicted_ms"] is not None]
    assert fitted and abs(sum(b["predicted_ms"] - b["actual_ms"] for b in fitted) / len(fitted)) < 5.0
    recorded = (tmp / "rec").read_text().split()
    assert sorted(recorded) == sorted(f"r{i}" for i in range(len(replies)))  # once each: none lost, none twice


def test_knob_changes_lose_and_duplicate_no_request(server: EmbeddedServer) -> None:
    tmp: Path = server.tmp  # type: ignore[attr-defined]
    record = tmp / "churn-rec"
    phases = [  # the oracle's phases switch batch size, delay and workers every 0.4 s, under load
        {"until_s": 0.4 * (i + 1), **knobs}
        for i, knobs in enumerate(
            [
                {"batch_size": 1, "max_batch_delay_ms": 0, "workers": 1},
                {"batch_size": 8, "max_batch_delay_ms": 20, "workers": 2},
                {"batch_size": 3, "max_batch_delay_ms": 5, "workers": 1},
                {"batch_size": 16, "max_batch_delay_ms": 10, "workers": 2},
            ]
            * 2
        )
    ]
    config = {
        "controller": {"policy": "oracle", "slo": {"p99_ms": 1000}, "phases": phases, "bounds": {"workers": [1, 2]}},
        "sleep": {"record": str(record)},
    }
    sleep_archive(tmp / "store", "churn", batch_ms=5, item_ms=1, model_config=config)
    url = urllib.parse.quote("churn.mar")
    registered = call("POST", f"{server.management_url}/models?url={url}&initial_workers=1&synchronous=true")
    assert registered.status == 200, registered.body
    try:
        with ThreadPoolExecutor(32) as pool:
            futures, _ = open_loop(server, "churn", [(3.2, 100.0)], pool)
            replies = [f.result() for f in futures]
        assert [r.status for r in replies] == [200] * len(replies)
        assert [r.json()["echo"] for r in replies] == [f"r{i}" for i in range(len(replies))]
        assert sorted(record.read_text().split()) == sorted(f"r{i}" for i in range(len(replies)))
        described = describe(server, "churn")
        assert described["knobChanges"] >= 6
        assert {json.dumps(c["new"], sort_keys=True) for c in described["recentChanges"]} >= {
            json.dumps({"batch_size": 8, "max_batch_delay_ms": 20.0, "workers": 2, "reserve": 0}, sort_keys=True)
        }
    finally:
        call("DELETE", f"{server.management_url}/models/churn")


@pytest.mark.parametrize(
    ("controller", "key"),
    [
        ({"slo": {"p99_ms": 100}, "bounds": {"batch_size": [0, 8]}}, "controller.bounds.batch_size"),
        ({"slo": {"p99_ms": 100}, "bounds": {"workers": [1, 1000]}}, "controller.bounds.workers"),
        ({"slo": {"p95_ms": 100}, "shed": "yes"}, "controller.shed"),
        ({"slo": {"p99_ms": 10}, "probe": "x"}, "controller.slo.p99_ms"),  # below the 30 ms batch-1 time
    ],
)
def test_invalid_settings_fail_at_registration_naming_the_key(
    server: EmbeddedServer, controller: dict[str, Any], key: str
) -> None:
    tmp: Path = server.tmp  # type: ignore[attr-defined]
    sleep_archive(tmp / "store", "bad", batch_ms=30, model_config={"controller": controller})
    url = urllib.parse.quote("bad.mar")
    reply = call("POST", f"{server.management_url}/models?url={url}&initial_workers=1&synchronous=true")
    assert reply.status == 400, reply.body
    assert key in reply.json()["message"]
    assert call("GET", f"{server.management_url}/models/bad").status == 404  # nothing left registered


THREADS = {  # 120 + 10n ms at one thread, half at two (the handler speeds up in full), SLA P99 200 ms
    "numThreads": 1,
    "sleep": {"per_thread": True},
    "controller": {
        "slo": {"p99_ms": 200},
        "bounds": {"batch_size": [1, 4], "max_batch_delay_ms": [0, 0], "workers": [1, 1], "threads": [1, 2]},
    },
}


@pytest.mark.skipif(physical_cores() < 2, reason="two threads need two physical cores")
def test_a_batch_of_one_too_slow_at_one_thread_gets_a_second_thread(tmp_path: Path) -> None:
    # By hand: at one thread a request takes 130 ms and may wait for one before it, 2 x 130 = 260 > 198 (SLA 200 less
    # 2 ms of slack): no batch size or delay can hold the SLA, a second thread can (2 x 65 = 130). Alone on the
    # server (every other model's workers would take cores), so both of the host's cores are the model's.
    store = tmp_path / "store"
    config = {**THREADS, "controller": {**THREADS["controller"], "log": str(tmp_path / "threads.jsonl")}}
    sleep_archive(store, "threads", batch_ms=120, item_ms=10, model_config=config)
    properties = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
    with EmbeddedServer(store, {"threads": "threads.mar"}, properties, workdir=tmp_path / "server") as running:
        first = [predict(running, "threads", f"a{i}".encode()) for i in range(3)]
        assert [r.status for r in first] == [200] * 3
        assert first[0].json()["threads"] == 1  # as registered
        wait_for(lambda: describe(running, "threads")["knobs"].get("threads") == 2, 5, "two threads")
        with ThreadPoolExecutor(4) as pool:  # concurrent requests too: batches of several sizes tell b at 2 threads
            later = list(pool.map(lambda i: predict(running, "threads", f"b{i}".encode()), range(24)))
        assert [r.status for r in later] == [200] * 24
        assert {r.json()["threads"] for r in later} == {2}  # every later batch ran with two threads
        described = describe(running, "threads")
        assert described["knobs"]["threads"] == 2  # and stays: one thread, guessed from two, still misses
        assert set(described["fitByThreads"]) == {"1", "2"}
        assert described["fitByThreads"]["1"]["batches"] >= 1
        assert described["fitByThreads"]["2"]["batches"] >= 1
        moved = [c for c in described["recentChanges"] if c["old"].get("threads") == 1 and c["new"]["threads"] == 2]
        assert moved, described["recentChanges"]
        assert metric_values(running, "servetune_controller_threads", "threads") == {"": 2.0}
        time.sleep(0.3)  # the decision log is written at the next tick
        logged = [json.loads(line) for line in (tmp_path / "threads.jsonl").read_text().splitlines()]
        ran = [r["threads"] for r in logged if r["kind"] == "batch"]
        # every batch ran at 1 thread until the change, then at 2 (as the answers say), each logged with its threads
        assert ran[0] == 1 and ran[-1] == 2 and ran == sorted(ran)
        assert sum(r["size"] for r in logged if r["kind"] == "batch") == 27


def test_a_light_model_whose_controller_moves_its_workers_forks_them_from_a_parent(tmp_path: Path) -> None:
    """A handler that imports nothing heavy spawns its workers (~150 ms of a core each), unless its controller moves
    its workers: then a worker asked for at a load step is forked from the model's parent in milliseconds."""
    import psutil

    store = tmp_path / "store"
    moved = "controller:\n  slo: {p99_ms: 500}\n  bounds: {workers: [1, 2]}\n"
    held = "controller:\n  slo: {p99_ms: 500}\n  bounds: {batch_size: [1, 8]}\n"
    yaml_archive(store, "moved", moved)  # the echo handler: json only
    yaml_archive(store, "held", held)
    properties = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
    with EmbeddedServer(store, {"moved": "moved.mar", "held": "held.mar"}, properties) as server:
        assert server.proc is not None
        parents = {}
        for name in ("moved", "held"):
            assert predict(server, name, b"x").status == 200
            [worker] = call("GET", f"{server.management_url}/models/{name}").json()[0]["workers"]
            parents[name] = psutil.Process(worker["pid"]).ppid()
        assert parents["held"] == server.proc.pid  # spawned by the frontend
        assert parents["moved"] != server.proc.pid
        assert "servetune.server.forkserver" in psutil.Process(parents["moved"]).cmdline()
