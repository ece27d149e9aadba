"""The management API answers as TorchServe 0.12 answers the requests of its own API tests
(``test/postman/management_data.json`` in pytorch/serve): the same status for each, with the exceptions listed in
docs/torchserve-compat.md (where TorchServe answers 500 from an exception, servetune answers 400 naming the
parameter). Written once in the API layer, so checked here on the native backend.
"""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from http_client import call
from models import sleep_archive

TORCHSERVE_ALLOWED_URLS = "https://s3.amazonaws.com/.*,https://torchserve.pytorch.org/.*"


class Status404(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def not_found_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Status404)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def mgmt(tmp_path: Path, start_server, not_found_url: str) -> str:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=1)
    shutil.copy(store / "sleep.mar", store / "densenet161.mar")  # as if downloaded before
    allowed = f"{TORCHSERVE_ALLOWED_URLS},{not_found_url}/.*"
    server = start_server(
        model_store=store,
        properties={"enable_model_api": "true", "allowed_urls": allowed, "default_workers_per_model": "0"},
    )
    return str(server.management_url)


def status(method: str, url: str) -> int:
    return call(method, url, timeout=120).status


def test_register_parameters_as_torchserve_reads_them(mgmt: str) -> None:
    assert status("POST", f"{mgmt}/models") == 400  # missing url
    assert status("POST", f"{mgmt}/models?url=&model_name=resnet-18") == 404  # empty url
    bad_runtime = call("POST", f"{mgmt}/models?url=sleep.mar&runtime=python4")
    assert (bad_runtime.status, bad_runtime.json()["message"]) == (400, "Invalid RuntimeType value: python4")

    # an integer that does not parse is "not given": the default applies
    assert status("POST", f"{mgmt}/models?url=sleep.mar&batch_size=dd&initial_workers=1") == 200
    [described] = call("GET", f"{mgmt}/models/sleep").json()
    assert (described["batchSize"], described["maxBatchDelay"], len(described["workers"])) == (1, 100, 1)
    assert status("DELETE", f"{mgmt}/models/sleep") == 200
    query = "batch_size=2&initial_workers=1&max_batch_delay=junk"
    assert status("POST", f"{mgmt}/models?url=sleep.mar&{query}") == 200
    [described] = call("GET", f"{mgmt}/models/sleep").json()
    assert (described["batchSize"], described["maxBatchDelay"]) == (2, 100)
    assert status("DELETE", f"{mgmt}/models/sleep") == 200

    negative = call("POST", f"{mgmt}/models?url=sleep.mar&initial_workers=-1")
    assert negative.json()["status"].endswith(
        "registered with 0 initial workers. Use scale workers API to add workers for the model."
    )
    assert status("DELETE", f"{mgmt}/models/sleep") == 200
    # synchronous is true only for "true": anything else registers in the background (202)
    assert status("POST", f"{mgmt}/models?url=sleep.mar&initial_workers=1&synchronous=-1") == 202
    assert status("DELETE", f"{mgmt}/models/sleep") == 200


def test_startup_timeout_zero(mgmt: str) -> None:
    assert status("POST", f"{mgmt}/models?url=sleep.mar&startup_timeout=0") == 200  # 0 workers: nothing to start
    assert status("DELETE", f"{mgmt}/models/sleep") == 200
    failed = call("POST", f"{mgmt}/models?url=sleep.mar&batch_size=3&initial_workers=3&startup_timeout=0")
    assert (failed.status, failed.json()["type"]) == (500, "InternalServerException")
    assert status("GET", f"{mgmt}/models/sleep") == 404, "a failed synchronous start unregisters the model"


def test_an_invalid_handler_registers_with_no_worker_and_fails_to_scale(mgmt: str) -> None:
    assert status("POST", f"{mgmt}/models?url=sleep.mar&handler=invalidHandler") == 200
    failed = call("PUT", f"{mgmt}/models/sleep?min_worker=1&synchronous=true")
    assert (failed.status, failed.json()["type"]) == (500, "InternalServerException")
    assert status("DELETE", f"{mgmt}/models/sleep") == 200


def test_scale_parameters_as_torchserve_reads_them(mgmt: str) -> None:
    assert status("POST", f"{mgmt}/models?url=sleep.mar&initial_workers=1") == 200
    for query in (
        "number_gpu=10",
        "number_gpu=-1",
        "timeout=-1",
        "timeout=0",
        "min_worker=1&synchronous=Nan",
        "min_worker=nan&synchronous=nan",
        "",
        "min_worker=0",
        "min_worker=1",
    ):
        assert status("PUT", f"{mgmt}/models/sleep?{query}") == 202, query
    assert status("PUT", f"{mgmt}/models/sleep?min_worker=1&max_worker=1&synchronous=true") == 200
    assert status("PUT", f"{mgmt}/models/sleep/1.0?min_worker=1&synchronous=true") == 200
    assert status("PUT", f"{mgmt}/models/sleep/0.0?min_worker=1&synchronous=true") == 404
    assert status("PUT", f"{mgmt}/models/resnet181?min_worker=1") == 404
    assert status("PUT", f"{mgmt}/models/sleep?min_worker=2&max_worker=1") == 400
    assert status("PUT", f"{mgmt}/models/sleep?max_worker=-1") == 400
    negative = call("PUT", f"{mgmt}/models/sleep?min_worker=-1")  # TorchServe: 500 from an exception
    assert (negative.status, negative.json()["message"]) == (
        400,
        "min_worker must be between 0 and 64, got -1 (max_workers_per_model=64)",
    )


def test_list_describe_set_default_and_unregister(mgmt: str) -> None:
    assert status("POST", f"{mgmt}/models?url=sleep.mar") == 200
    for query in (
        "limit=&next_page_token=",
        "limit=1",
        "limit=-1",
        "limit=1&next_page_token=1",
        "limit=1&next_page_token=-1",
        "next_page_token=12",
    ):
        assert status("GET", f"{mgmt}/models?{query}") == 200, query
    assert call("GET", f"{mgmt}/models?next_page_token=12").json() == {"models": []}
    assert status("GET", f"{mgmt}/models/sleep/all") == 200
    assert status("GET", f"{mgmt}/models/sleep/1.0") == 200
    assert status("GET", f"{mgmt}/models/sleep/0.0") == 404
    assert status("GET", f"{mgmt}/models/invalid_squeezenet1_1") == 404
    assert status("PUT", f"{mgmt}/models/sleep/1.0/set-default") == 200
    assert status("PUT", f"{mgmt}/models/sleep/0.0/set-default") == 404
    assert status("PUT", f"{mgmt}/models/squeezenet0_1/1.0/set-default") == 404
    assert status("DELETE", f"{mgmt}/models/sleep/0.0") == 404
    assert status("DELETE", f"{mgmt}/models/sleep/?synchronous=true") == 200  # a trailing slash, as TorchServe
    assert status("POST", f"{mgmt}/models?url=sleep.mar") == 200
    assert status("DELETE", f"{mgmt}/models/sleep/?timeout=true&synchronous=-1") == 200
    assert status("DELETE", f"{mgmt}/models/invalid_squeezenet1_1") == 404


def test_urls_with_torchserve_default_allowed_urls(mgmt: str, not_found_url: str) -> None:
    existing = call("POST", f"{mgmt}/models?url=https://torchserve.pytorch.org/mar_files/densenet161.mar")
    assert (existing.status, existing.json()["message"]) == (500, "Model file already exists densenet161.mar")
    unreachable = call("POST", f"{mgmt}/models?url=https://torchserve.pytorch.org/mar_files/invalid-resnet-18.mar")
    assert (unreachable.status, unreachable.json()["type"]) == (400, "DownloadArchiveException")
    missing = call("POST", f"{mgmt}/models?url={not_found_url}/gone.mar")
    assert (missing.status, missing.json()["type"]) == (400, "DownloadArchiveException")
    assert "HTTP 404" in missing.json()["message"]
    refused = call("POST", f"{mgmt}/models?url=https://example.com/x.mar")
    assert refused.status == 404 and "does not match any allowed URL" in refused.json()["message"]
