"""A worker process started the way the frontend starts it (``servetune.server.process``): without forking the
frontend, its spec over the socket (not its command line), its death and exit code seen at once."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from servetune._exceptions import WorkerLoadError
from servetune.api.types import InferRequest, Input
from servetune.handlers.spec import WorkerSpec
from servetune.server.messages import Predict
from servetune.server.process import WorkerProcess

HANDLER = textwrap.dedent(
    """
    import os

    def handle(data, context):
        if data is None:
            if context.model_yaml_config.get("crash"):
                os.kill(os.getpid(), 11)
            return None
        blob = context.model_yaml_config.get("blob", "")
        return [{"pid": os.getpid(), "blob_len": len(blob)} for _ in data]
    """
)


def spec(model_dir: Path, **config: Any) -> WorkerSpec:
    model_dir.mkdir(exist_ok=True)
    (model_dir / "handler.py").write_text(HANDLER)
    manifest = {"runtime": "python", "model": {"modelName": "m", "handler": "handler.py", "modelVersion": "1.0"}}
    return WorkerSpec(
        model_name="m", model_dir=str(model_dir), manifest=manifest, batch_size=1, model_yaml_config=config
    )


@pytest.fixture
def forks() -> Iterator[list[str]]:
    """Python's fork hooks of this process, counted: a fork() of the frontend runs them (uvloop's subprocess
    runs ``PyOS_BeforeFork``); vfork + exec runs none."""
    seen: list[str] = []
    active = [True]
    os.register_at_fork(before=lambda: active[0] and seen.append("before"))
    yield seen
    active[0] = False  # hooks cannot be unregistered: this one goes quiet


def run_on_uvloop(main: Callable[[], Awaitable[Any]]) -> Any:
    """On uvloop's event loop, as the server runs (``servetune.api.server``)."""
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def predict(worker: WorkerProcess) -> Awaitable[Any]:
    request = InferRequest("r1", {}, [Input("body", None, b"x")], 0.0)
    return worker.run(Predict([request], 1, 0, ()), 60.0)


def test_a_worker_starts_without_forking_the_frontend_takes_a_large_spec_and_its_death_is_seen_at_once(
    tmp_path: Path, forks: list[str]
) -> None:
    blob = "x" * (3 << 20)  # 3 MiB: over Linux's 128 KiB for one argument and 2 MiB for all of them

    async def main() -> tuple[Any, int | None, bool, str]:
        worker = WorkerProcess("9000", spec(tmp_path / "m", blob=blob), dict(os.environ))
        await worker.start(120.0)
        result = await predict(worker)
        assert worker.pid is not None and worker.alive
        os.kill(worker.pid, signal.SIGKILL)
        await asyncio.wait_for(worker.exited.wait(), 10.0)
        await worker.wait_reaped(10.0)
        return result, worker.pid, worker.alive, worker.exit_description()

    result, pid, alive, exit_description = run_on_uvloop(main)
    assert forks == []
    [answer] = result.answers
    assert answer.status == 200 and b'"blob_len": %d' % len(blob) in answer.body and str(pid).encode() in answer.body
    assert (alive, exit_description) == (False, "killed by SIGKILL")


def test_a_worker_that_dies_while_loading_names_its_signal(tmp_path: Path) -> None:
    async def main() -> str:
        worker = WorkerProcess("9000", spec(tmp_path / "m", crash=True), dict(os.environ))
        with pytest.raises(WorkerLoadError) as info:
            await worker.start(120.0)
        return str(info.value)

    assert run_on_uvloop(main) == "worker process exited while loading (killed by SIGSEGV)"
