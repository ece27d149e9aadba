"""A worker process started the way the frontend starts it (``servetune.server.process``): without forking the
frontend, its spec over the socket (not its command line), its death and exit code seen at once; spawned, or forked
by its model's parent process (``servetune.server.parent``), which the frontend starts without forking either."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import uvloop

from procfs import anonymous_memory
from servetune._exceptions import ParentUnavailable, WorkerDied, WorkerLoadError
from servetune.api.types import InferRequest, Input
from servetune.handlers.spec import WorkerSpec
from servetune.server.messages import Predict, Result
from servetune.server.parent import Forking, ModelParent
from servetune.server.process import WorkerProcess

HANDLER = textwrap.dedent(
    """
    import os
    import threading

    BLOCK = bytearray()

    def handle(data, context):
        global BLOCK
        if data is None:
            config = context.model_yaml_config
            if config.get("crash"):
                os.kill(os.getpid(), 11)
            if config.get("thread"):  # a handler whose load starts a thread: no fork after it
                threading.Thread(target=threading.Event().wait, daemon=True).start()
            BLOCK = bytearray(b"m") * (config.get("mb", 0) << 20)  # written: memory of whichever process loads it
            return None
        blob = context.model_yaml_config.get("blob", "")
        return [{"pid": os.getpid(), "ppid": os.getppid(), "blob_len": len(blob), "block": len(BLOCK)} for _ in data]
    """
)
# A handler module that leaves a file open when imported: workers forked after it would share its offset.
OPENS_A_FILE = "SELF = open(__file__)\n" + HANDLER


def spec(model_dir: Path, source: str = HANDLER, **config: Any) -> WorkerSpec:
    model_dir.mkdir(exist_ok=True)
    (model_dir / "handler.py").write_text(source)
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


async def predict(worker: WorkerProcess) -> Any:
    request = InferRequest("r1", {}, [Input("body", None, b"x")], 0.0)
    (pending,) = await worker.send([Predict([request], 1, 0, ())])
    return await worker.result(pending, 60.0)


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


ECHO = textwrap.dedent(
    """
    import os

    def handle(data, context):
        if data is None:
            return None
        body = bytes(data[0]["body"])
        if body == b"die":
            os._exit(3)
        return [body]
    """
)


def one(body: bytes) -> Predict:
    return Predict([InferRequest(body.decode(), {}, [Input("body", None, body)], 0.0)], 1, 0, ())


def test_batches_sent_in_one_write_are_answered_in_order_and_a_death_fails_those_still_waiting(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[list[bytes], bytes, list[str]]:
        worker = WorkerProcess("9000", spec(tmp_path / "m", ECHO), dict(os.environ))
        await worker.start(120.0)
        sent = await worker.send([one(b"a%d" % i) for i in range(8)])
        answers = [(await worker.result(p, 60.0)).answers[0].body for p in sent]
        sent = await worker.send([one(b"ok"), one(b"die"), one(b"never")])
        first = (await worker.result(sent[0], 60.0)).answers[0].body
        failed = []
        for pending in sent[1:]:
            with pytest.raises(WorkerDied) as info:
                await worker.result(pending, 60.0)
            failed.append(str(info.value))
        await worker.wait_reaped(10.0)
        return answers, first, failed

    answers, first, failed = run_on_uvloop(main)
    assert answers == [b"a%d" % i for i in range(8)] and first == b"ok"
    assert len(failed) == 2 and all("died" in f for f in failed)


def test_a_batchs_result_is_given_in_the_read_callback_before_its_future_is_answered(tmp_path: Path) -> None:
    """``send(now=...)``: each batch's function gets its ``Result`` as the frame is read, while its future is still
    pending (the pool answers the requests from there); the future then gets the same result; a batch without one is
    answered as before; a batch that fails (its worker died) gives nothing."""

    async def main() -> tuple[list[tuple[str, bool, bytes]], list[bytes], list[bool]]:
        worker = WorkerProcess("9000", spec(tmp_path / "m", ECHO), dict(os.environ))
        await worker.start(120.0)
        given: list[tuple[str, bool, bytes, Result]] = []
        futures: list[asyncio.Future[Any]] = []

        def keep(name: str) -> Callable[[Result], None]:
            def now(result: Result) -> None:
                given.append((name, futures[len(given)].done(), result.answers[0].body, result))

            return now

        sent = await worker.send([one(b"a"), one(b"b"), one(b"c")], [keep("a"), keep("b"), None])
        futures.extend(sent)
        results = [await worker.result(p, 60.0) for p in sent]
        same = [results[i] is given[i][3] for i in range(2)]
        sent = await worker.send([one(b"die")], [keep("die")])
        with pytest.raises(WorkerDied):
            await worker.result(sent[0], 60.0)
        await worker.wait_reaped(10.0)
        return [g[:3] for g in given], [r.answers[0].body for r in results], same

    given, answers, same = run_on_uvloop(main)
    assert given == [("a", False, b"a"), ("b", False, b"b")]  # nothing for "c" (none given) nor "die" (it died)
    assert answers == [b"a", b"b", b"c"] and same == [True, True]


@pytest.mark.parametrize("started", ["spawned", "forked"])
def test_a_worker_that_dies_while_loading_names_its_signal(tmp_path: Path, started: str) -> None:
    async def main() -> str:
        crashing = spec(tmp_path / "m", crash=True)
        parent = None
        if started == "forked":  # its parent imported the handler; the worker loads the model, and crashes
            parent = ModelParent("m", crashing, "imports", dict(os.environ))
            await parent.start(120.0)
        worker = WorkerProcess("9000", crashing, dict(os.environ), parent)
        try:
            with pytest.raises(WorkerLoadError) as info:
                await worker.start(120.0)
        finally:
            if parent is not None:
                await parent.stop()
        return str(info.value)

    assert run_on_uvloop(main) == "worker process exited while loading (killed by SIGSEGV)"


def test_workers_forked_by_a_model_parent_share_its_memory_and_the_frontend_never_forks(
    tmp_path: Path, forks: list[str]
) -> None:
    """The parent loads the model (32 MiB written in its load) once; two workers forked from it hold those pages
    shared, answer, die as any worker (their exit code reported by the parent), and outlive their parent."""
    mb = 32

    async def main() -> None:
        loaded = spec(tmp_path / "m", mb=mb)
        parent = ModelParent("m", loaded, "model", dict(os.environ))
        preloaded = await parent.start(120.0)
        assert preloaded.pid == parent.pid and not preloaded.hazard
        first, second = (WorkerProcess(str(9000 + i), loaded, dict(os.environ), parent) for i in range(2))
        await asyncio.gather(first.start(60.0), second.start(60.0))
        for worker in (first, second):
            [answer] = (await predict(worker)).answers
            reply = json.loads(answer.body)
            assert (reply["pid"], reply["ppid"], reply["block"]) == (worker.pid, parent.pid, mb << 20)
            assert worker.pid is not None
            shared, private = anonymous_memory(worker.pid)
            assert shared >= mb << 20 and private < mb << 20, (shared, private)  # the parent's pages, not a copy
        assert first.pid is not None and second.pid is not None
        os.kill(first.pid, signal.SIGKILL)
        await asyncio.wait_for(first.exited.wait(), 10.0)
        await first.wait_reaped(10.0)
        assert (first.alive, first.exit_description()) == (False, "killed by SIGKILL")  # told by the parent
        parent.kill()
        await asyncio.wait_for(parent.gone.wait(), 10.0)
        [answer] = (await predict(second)).answers  # a worker outlives its parent
        assert json.loads(answer.body)["pid"] == second.pid
        with pytest.raises(ParentUnavailable):
            await WorkerProcess("9002", loaded, dict(os.environ), parent).start(60.0)
        await second.stop()
        await parent.wait_reaped(10.0)
        assert not psutil.pid_exists(second.pid) or psutil.Process(second.pid).status() == psutil.STATUS_ZOMBIE

    run_on_uvloop(main)
    assert forks == []


def test_a_model_whose_load_starts_a_thread_is_forked_from_a_parent_that_imports_only(tmp_path: Path) -> None:
    """A fork copies one thread: a parent whose model load started one must not fork. The next level down (a
    parent that only imported the handler) forks, and each worker loads the model itself; a handler module that
    leaves a file open when imported gets no parent (its workers are spawned)."""

    async def main() -> None:
        threaded = spec(tmp_path / "t", thread=True)
        forking = Forking("t", "model", Path(threaded.model_dir), threaded.manifest)
        parent = await forking.parent_for(threaded, dict(os.environ), 120.0)
        assert parent is not None and parent.level == "imports"
        worker = WorkerProcess("9000", threaded, dict(os.environ), parent)
        await worker.start(60.0)
        [answer] = (await predict(worker)).answers
        assert json.loads(answer.body)["ppid"] == parent.pid
        await worker.stop()
        await forking.close(final=True)

        leaky = spec(tmp_path / "f", OPENS_A_FILE)
        forking = Forking("f", "model", Path(leaky.model_dir), leaky.manifest)
        assert await forking.parent_for(leaky, dict(os.environ), 120.0) is None
        await forking.close(final=True)

    run_on_uvloop(main)
