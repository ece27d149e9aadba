"""Threads and core sets on real workers: set by model-config.yaml and config.properties, changed in place through
the management API, and read back from each worker process itself (describe)."""

from __future__ import annotations

import os
from pathlib import Path

from http_client import call
from models import sleep_archive

CPUS = sorted(os.sched_getaffinity(0))


def workers(server, model: str = "sleep") -> list[dict]:  # type: ignore[no-untyped-def]
    return call("GET", f"{server.management_url}/models/{model}").json()[0]["workers"]


def test_pinned_workers_run_on_their_own_cores_and_changes_apply_in_place(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=1, model_config={"numThreads": 1, "cpuPinning": True, "interOpThreads": 1})
    server = start_server(
        model_store=store,
        models={"sleep": "sleep.mar"},
        properties={"default_workers_per_model": "2", "enable_model_api": "true"},
    )
    [described] = call("GET", f"{server.management_url}/models/sleep").json()
    assert (described["numThreads"], described["interOpThreads"], described["cpuPinning"]) == (1, 1, True)
    first = workers(server)
    assert [w["cpuCores"] for w in first] == [[CPUS[0]], [CPUS[1]]]  # disjoint, one core each
    assert {(w["numThreads"], w["interOpThreads"]) for w in first} == {(1, 1)}

    # unpinned, in place: the workers run on every CPU from their next batch, and keep their pids
    assert call("PUT", f"{server.management_url}/models/sleep?cpu_pinning=false").status == 200
    for _ in range(4):
        assert call("POST", f"{server.inference_url}/predictions/sleep", b"x").status == 200
    after = workers(server)
    assert [w["pid"] for w in after] == [w["pid"] for w in first]
    assert [w["cpuCores"] for w in after] == [CPUS, CPUS]

    # inter-op threads are read at start: the workers are replaced, one at a time, with the new setting
    changed = call("PUT", f"{server.management_url}/models/sleep?inter_op_threads=2")
    assert changed.status == 200 and "inter_op_threads=2" in changed.json()["status"]
    replaced = workers(server)
    assert len(replaced) == 2 and not {w["pid"] for w in replaced} & {w["pid"] for w in first}
    assert {w["interOpThreads"] for w in replaced} == {2}

    # pinning checked against the workers the same call asks for: 1 worker on every CPU fits, 2 would not
    shrink = f"min_worker=1&max_worker=1&num_threads={len(CPUS)}&cpu_pinning=true&synchronous=true"
    assert call("PUT", f"{server.management_url}/models/sleep?{shrink}").status == 200
    assert call("POST", f"{server.inference_url}/predictions/sleep", b"x").status == 200
    [alone] = workers(server)
    assert alone["cpuCores"] == CPUS and alone["numThreads"] == len(CPUS)
    assert (
        call("PUT", f"{server.management_url}/models/sleep?cpu_pinning=false&num_threads=1&min_worker=2").status == 202
    )
    assert len(workers(server)) == 2

    # more pinned cores than this machine has: refused, naming the key, and nothing changes
    refused = call("PUT", f"{server.management_url}/models/sleep?cpu_pinning=true&num_threads={len(CPUS)}")
    assert refused.status == 400 and refused.json()["message"].startswith("cpuPinning: model sleep")
    assert call("GET", f"{server.management_url}/models/sleep").json()[0]["cpuPinning"] is False


def test_the_torchserve_cpu_launcher_keys_pin_every_model(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=1)
    properties = {"cpu_launcher_enable": "true", "cpu_launcher_args": "--use_logical_core --ncores_per_instance 1"}
    server = start_server(model_store=store, models={"sleep": "sleep.mar"}, properties=properties)
    [worker] = workers(server)
    assert (worker["numThreads"], worker["cpuCores"]) == (1, [CPUS[0]])
