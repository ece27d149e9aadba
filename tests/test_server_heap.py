"""The garbage collector's full passes kept off the request path: a worker, spawned or forked, answers with its
heap frozen (the interpreter, the handler's imports and the model in the permanent generation), the frontend freezes
its start-up heap before it says it is up, and the load generator holds its own heap frozen while it runs. (Measured
before the change, at ~200 req/s: the frontend's full passes over ~56k objects stopped its event loop 40-48 ms
every ~50 s, a 1 s window of late answers each time; see docs/controller.md.)"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from http_client import call
from models import handler_archive

HANDLER = textwrap.dedent(
    """
    import gc
    import os

    def handle(data, context):
        if data is None:
            return None
        return [{"frozen": gc.get_freeze_count(), "pid": os.getpid()} for _ in data]
    """
)


@pytest.mark.parametrize("preload", ["off", "model"])
def test_a_worker_answers_with_its_heap_frozen(tmp_path: Path, start_server, preload: str) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    handler_archive(store, "heap", "handler.py", HANDLER, {"workerPreload": preload})
    server = start_server(model_store=store, models={"heap": "heap.mar"})
    answer = call("POST", f"{server.inference_url}/predictions/heap", b"x")
    assert answer.status == 200, answer.text
    # an interpreter with servetune's worker imported holds thousands of objects; unfrozen, the count is 0
    assert answer.json()["frozen"] > 1000


def test_the_frontend_freezes_its_start_up_heap_before_it_is_up(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("disable_token_authorization=true\ninference_address=http://127.0.0.1:0\n"
                      "management_address=http://127.0.0.1:0\nmetrics_address=http://127.0.0.1:0\n"
                      "grpc_inference_port=0\ngrpc_management_port=0\n")  # fmt: skip
    ready = tmp_path / "ready.json"
    args = [sys.executable, "-m", "servetune", "serve", "--ts-config", str(config), "--ready-file", str(ready)]
    proc = subprocess.Popen([*args, "--log-level", "debug"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the server did not come up"
        assert json.loads(ready.read_text())["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    frozen = re.search(r"start-up: heap collected and frozen, (\d+) objects", output)
    assert frozen, output[-3000:]
    assert int(frozen.group(1)) > 10_000  # the APIs, uvicorn, the gRPC stack: tens of thousands of objects
    # ... and before the server said it was up
    assert output.index(frozen.group(0)) < output.index("Model server started.")


def test_the_load_generators_freeze_is_undone_after_the_last_run_only() -> None:
    # in a fresh interpreter: a test process may have frozen its heap already (an in-process API server does)
    script = textwrap.dedent(
        """
        import gc
        from servetune.startup import heap_frozen
        
        assert gc.get_freeze_count() == 0
        with heap_frozen():
            outer = gc.get_freeze_count()
            assert outer > 0
            with heap_frozen():  # a run inside a run (run_together's): one freeze
                assert gc.get_freeze_count() >= outer
            assert gc.get_freeze_count() >= outer  # the inner run's end leaves the outer's freeze
        assert gc.get_freeze_count() == 0
        # a process that froze its heap for good keeps it frozen after a run
        gc.freeze()
        kept = gc.get_freeze_count()
        with heap_frozen():
            pass
        assert gc.get_freeze_count() >= kept > 0
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
