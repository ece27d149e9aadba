"""What a served model costs in memory, read from a real server's processes (/proc), not from imports in this test:
the frontend carries no torch, a worker only what its handler imports, two workers of one model share their
weights' pages and (forked from the model's parent) torch's, and describe and the metrics API report each worker's
RSS and PSS. The last tests kill workers and the parent: a killed one is replaced."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from http_client import call
from models import ECHO_HANDLER, handler_archive, sleep_archive
from procfs import anonymous_memory
from servetune.archive import create_archive
from servetune.embedded import EmbeddedServer
from servetune.server.batch_memory import IDLE_S, BatchMemory

IN, OUT = 1024, 2048  # an 8 MiB weight matrix: large next to the rest of what a worker maps from its archive
BLOCK = 64 << 20  # what the batchmem handler allocates for each batch, as a model's activations

# Every batch allocates (and zero-fills: every page touched) a 64 MiB block, then frees it.
BATCHMEM_HANDLER = textwrap.dedent(
    f"""
    def handle(data, context):
        if data is None:
            return None
        block = bytearray({BLOCK})
        block[-1] = 1
        del block
        return ["ok" for _ in data]
    """
)

MODEL_FILE = textwrap.dedent(
    f"""
    import torch

    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear({IN}, {OUT})

        def forward(self, x):
            return self.fc(x)
    """
)

# The built-in loading path (BaseHandler.initialize: model file + state_dict); only handle() is its own.
WEIGHTS_HANDLER = textwrap.dedent(
    f"""
    import os

    import torch
    from ts.torch_handler.base_handler import BaseHandler

    class WideHandler(BaseHandler):
        def handle(self, data, context):
            with torch.inference_mode():
                out = self.model(torch.ones(len(data), {IN}))
            return [{{"pid": os.getpid(), "sum": float(row.sum())}} for row in out]
    """
)


def weights_archive(store: Path, tmp: Path) -> float:
    """``wide.mar`` (2 workers, weights from a state_dict), and the sum its model answers for a row of ones."""
    import sys

    src = tmp / "wide-src"
    src.mkdir()
    (src / "wide_model.py").write_text(MODEL_FILE)
    (src / "wide_handler.py").write_text(WEIGHTS_HANDLER)
    (src / "model-config.yaml").write_text("minWorkers: 2\nmaxWorkers: 2\n")
    sys.path.insert(0, str(src))
    try:
        from wide_model import Wide  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(src))
    torch.manual_seed(0)
    model = Wide().eval()
    torch.save(model.state_dict(), src / "wide.pt")
    create_archive(
        model_name="wide",
        version="1.0",
        handler=str(src / "wide_handler.py"),
        model_file=str(src / "wide_model.py"),
        serialized_file=str(src / "wide.pt"),
        config_file=str(src / "model-config.yaml"),
        export_path=str(store),
        force=True,
    )
    with torch.inference_mode():
        return float(model(torch.ones(1, IN)).sum())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedServer, float]]:
    tmp = tmp_path_factory.mktemp("memory")
    store = tmp / "store"
    sleep_archive(store, name="noop", batch_ms=0)  # its handler imports no torch
    handler_archive(store, "echo", "echo.py", ECHO_HANDLER, {})  # its code imports json only
    handler_archive(store, "batchmem", "batchmem.py", BATCHMEM_HANDLER, {})
    expected = weights_archive(store, tmp)
    properties = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
    models = {"noop": "noop.mar", "wide": "wide.mar", "echo": "echo.mar", "batchmem": "batchmem.mar"}
    with EmbeddedServer(store, models, properties, workdir=tmp / "server") as server:
        yield server, expected


def maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def workers(server: EmbeddedServer, model: str) -> list[dict]:  # type: ignore[type-arg]
    return call("GET", f"{server.management_url}/models/{model}").json()[0]["workers"]  # type: ignore[no-any-return]


def test_the_frontend_process_maps_no_torch(served: tuple[EmbeddedServer, float]) -> None:
    server, _ = served
    assert server.proc is not None
    assert call("POST", f"{server.inference_url}/predictions/wide", b"x").status == 200  # torch is in use next door
    frontend = maps(server.proc.pid)
    assert "libtorch" not in frontend and "/torch/" not in frontend
    # the check can fail: a worker that runs a torch model maps libtorch
    assert "libtorch" in maps(workers(server, "wide")[0]["pid"])


def test_a_worker_whose_handler_needs_no_torch_maps_none(served: tuple[EmbeddedServer, float]) -> None:
    server, _ = served
    reply = call("POST", f"{server.inference_url}/predictions/noop", b"hello")
    assert reply.status == 200 and reply.json()["echo"] == "hello"
    [worker] = workers(server, "noop")
    mapped = maps(worker["pid"])
    assert "libtorch" not in mapped and "torchvision" not in mapped
    assert "numpy" not in mapped  # TorchServe's protocol needs no tensor codec: numpy loads on a first v2 request
    # its threads are still reported (and given to torch if the handler ever imports it)
    assert worker["numThreads"] >= 1
    # its handler mentions torch (in a branch this model does not take): forked from a parent, which has no torch
    # either
    assert "libtorch" not in maps(psutil.Process(worker["pid"]).ppid())


def test_a_model_whose_code_imports_nothing_heavy_has_no_parent_process(served: tuple[EmbeddedServer, float]) -> None:
    server, _ = served
    assert server.proc is not None
    [worker] = workers(server, "echo")
    assert psutil.Process(worker["pid"]).ppid() == server.proc.pid  # spawned by the frontend (workerPreload auto)


def weights_mapping(pid: int) -> tuple[int, int, set[str]]:
    """(RSS, PSS) in bytes of the process's mappings of the weights file, and the paths mapped."""
    rss = pss = 0
    paths: set[str] = set()
    current: str | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header line
            current = head[5] if len(head) >= 6 and head[5].endswith("/wide.pt") else None
            if current:
                paths.add(current)
        elif current and head[0] in ("Rss:", "Pss:"):
            kib = int(head[1]) * 1024
            rss, pss = (rss + kib, pss) if head[0] == "Rss:" else (rss, pss + kib)
    return rss, pss, paths


def test_two_workers_of_one_model_share_their_weights_pages(served: tuple[EmbeddedServer, float]) -> None:
    server, expected = served
    pids: set[int] = set()
    for _ in range(20):  # both workers run the model (and so read every weight) at least once
        answer = call("POST", f"{server.inference_url}/predictions/wide", b"x").json()
        assert answer["sum"] == pytest.approx(expected, rel=1e-5)  # the mapped weights are the saved ones
        pids.add(answer["pid"])
        if len(pids) == 2:
            break
    assert len(pids) == 2, "one worker answered every request"
    weights_bytes = IN * OUT * 4
    seen: list[set[str]] = []
    for pid in pids:
        rss, pss, paths = weights_mapping(pid)
        # the weights are the file's pages, mapped and read, not a private copy...
        assert rss >= 0.9 * weights_bytes, (pid, rss, paths)
        # ...and each worker's share of them is half: the other worker maps the same pages
        assert pss <= 0.6 * rss, (pid, rss, pss)
        seen.append(paths)
    assert len(seen[0]) == 1 and seen[0] == seen[1]  # one extracted file for both


def test_describe_and_metrics_report_each_workers_rss_and_pss(served: tuple[EmbeddedServer, float]) -> None:
    server, _ = served
    described = workers(server, "wide")
    assert len(described) == 2
    for worker in described:
        assert 0 < worker["memoryPss"] < worker["memoryUsage"]  # torch's libraries and the weights are shared
    text = call("GET", f"{server.metrics_url}/metrics").body.decode()
    for worker in described:
        labels = f'model_name="wide",model_version="1.0",worker_id="{worker["id"]}"'
        assert f"servetune_worker_rss_bytes{{{labels}}}" in text
        assert f"servetune_worker_pss_bytes{{{labels}}}" in text
    assert 'servetune_worker_pss_bytes{model_name="noop"' in text
    # the parent the wide workers were forked from: its own share of the pages it shares with them
    assert 'servetune_worker_pss_bytes{model_name="wide",model_version="1.0",worker_id="parent"}' in text
    assert not [line for line in text.splitlines() if 'model_name="echo"' in line and 'worker_id="parent"' in line]


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def test_a_busy_worker_reuses_a_batchs_memory_and_gives_it_back_once_idle(
    served: tuple[EmbeddedServer, float],
) -> None:
    server, _ = served
    url = f"{server.inference_url}/predictions/batchmem"
    [worker] = workers(server, "batchmem")
    process = psutil.Process(worker["pid"])
    pages = BLOCK // os.sysconf("SC_PAGE_SIZE")
    for _ in range(3):  # two batches within the worker's idle time (1 s); a slow host may need another try
        assert call("POST", url, b"x").status == 200
        faults, started = minor_faults(process.pid), time.monotonic()
        assert call("POST", url, b"x").status == 200
        if time.monotonic() - started < 0.8:
            break
    else:
        pytest.skip("the host never answered two requests within a second")
    # the second batch's block is the first one's pages, still mapped: glibc's default would have unmapped the
    # block at free (past its 32 MB mmap threshold) and faulted all of it in again
    assert minor_faults(process.pid) - faults < pages // 4
    held = process.memory_info().rss
    assert held >= BLOCK
    # once no batch has come for a second, the free pages go back
    deadline = time.monotonic() + 15.0
    while process.memory_info().rss > held - BLOCK // 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.memory_info().rss <= held - BLOCK // 2, (held, process.memory_info().rss)


class _Trims:
    """Stands for glibc where the worker's ``BatchMemory`` calls it: records when ``malloc_trim`` was called."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def malloc_trim(self, pad: int) -> int:
        self.at.append(time.monotonic())
        return 1


def test_the_give_back_never_runs_during_a_batch_and_waits_for_a_second_without_one() -> None:
    """The worker's thread (batch_memory.py): a batch that runs for longer than the idle time keeps its pages; once
    batches stop, the pages go back no sooner than IDLE_S after the last one ended, and once only while none runs."""
    trims = _Trims()
    memory = BatchMemory(trims)  # type: ignore[arg-type]
    memory.batch_started()
    memory.batch_ran()  # the first batch starts the thread
    memory.batch_started()  # a long one: running past the idle time
    time.sleep(2.5 * IDLE_S)
    assert trims.at == []
    ended = time.monotonic()  # taken before the batch's own end: the give-back counts from that one
    memory.batch_ran()
    deadline = ended + 10.0
    while not trims.at and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(trims.at) == 1 and trims.at[0] - ended >= IDLE_S
    assert not memory.holding
    time.sleep(1.5 * IDLE_S)
    assert len(trims.at) == 1  # nothing held since: no trim again


def test_workers_of_a_torch_model_are_forked_from_its_parent_and_share_torchs_memory(
    served: tuple[EmbeddedServer, float],
) -> None:
    server, _ = served
    assert server.proc is not None
    described = workers(server, "wide")
    parents = {psutil.Process(w["pid"]).ppid() for w in described}
    assert len(parents) == 1 and server.proc.pid not in parents  # one parent, not the frontend...
    [parent] = parents
    assert "servetune.server.forkserver" in psutil.Process(parent).cmdline()
    assert psutil.Process(parent).ppid() == server.proc.pid  # ...which the frontend started
    # before its own imports, importing torch meanwhile (servetune.server.early): the workers forked from that one
    assert psutil.Process(parent).cmdline()[-1] == "torch"
    assert "libtorch" in maps(parent)  # the parent imported torch once for both
    for worker in described:
        shared, private = anonymous_memory(worker["pid"])
        # torch's own memory (~250 MB with this torch: its import, before any model) is the parent's pages, not a
        # private copy: a spawned worker has all of it private (0 shared)
        assert shared >= 100 * 2**20, (worker["pid"], shared, private)
        assert private <= 0.5 * shared, (worker["pid"], shared, private)


def wait_for_workers(server: EmbeddedServer, model: str, old: set[int], timeout: float = 60.0) -> list[dict]:  # type: ignore[type-arg]
    """The model's workers once none of them is one of ``old`` and all are ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = workers(server, model)
        if all(w["status"] == "READY" and w["pid"] not in old for w in described):
            return described
        time.sleep(0.1)
    raise AssertionError(f"{model}: workers not replaced: {workers(server, model)}")


def answered_by(server: EmbeddedServer, model: str, pids: set[int]) -> list[dict]:  # type: ignore[type-arg]
    """Answers of ``model`` until each of ``pids`` has answered."""
    seen: set[int] = set()
    answers = []
    for _ in range(40):
        answers.append(call("POST", f"{server.inference_url}/predictions/{model}", b"x").json())
        seen.add(answers[-1]["pid"])
        if seen == pids:
            return answers
    raise AssertionError(f"answered by {seen}, expected {pids}")


def test_a_killed_worker_is_forked_again_from_its_parent(served: tuple[EmbeddedServer, float]) -> None:
    server, expected = served
    first, second = (w["pid"] for w in workers(server, "wide"))
    parent = psutil.Process(first).ppid()
    os.kill(first, signal.SIGKILL)
    pids = {w["pid"] for w in wait_for_workers(server, "wide", {first})}
    assert second in pids and {psutil.Process(pid).ppid() for pid in pids} == {parent}  # the same parent forked it
    for answer in answered_by(server, "wide", pids):
        assert answer["sum"] == pytest.approx(expected, rel=1e-5)


def test_workers_outlive_a_killed_parent_and_the_next_worker_gets_a_new_one(
    served: tuple[EmbeddedServer, float],
) -> None:
    server, _ = served
    assert server.proc is not None
    [worker] = workers(server, "noop")  # forked from a parent without torch: a new one starts fast
    parent = psutil.Process(worker["pid"]).ppid()
    os.kill(parent, signal.SIGKILL)
    answered_by(server, "noop", {worker["pid"]})  # it watches the frontend, not its parent
    # the server reaps its dead parent (the pid is gone then) and knows it died: the next worker gets a new one (a
    # worker replaced while the death is not noticed yet finds the parent's socket closed and is spawned instead)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(parent) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(worker["pid"], signal.SIGKILL)
    [new] = wait_for_workers(server, "noop", {worker["pid"]})
    new_parent = psutil.Process(new["pid"]).ppid()
    assert new_parent not in (parent, server.proc.pid)
    assert "servetune.server.forkserver" in psutil.Process(new_parent).cmdline()
    answered_by(server, "noop", {new["pid"]})
    assert call("GET", f"{server.inference_url}/ping").status == 200


def test_a_stale_parent_is_replaced_and_stops_once_its_last_worker_has_exited(
    served: tuple[EmbeddedServer, float],
) -> None:
    """A batch size changed in place makes the parent's loaded model stale: the next worker gets a new parent, and the
    old one stays (its worker would otherwise be orphaned) until that worker exits."""
    server, _ = served
    management = f"{server.management_url}/models/noop"
    [old] = workers(server, "noop")
    old_parent = psutil.Process(old["pid"]).ppid()
    watched = psutil.Process(old_parent)
    assert call("PUT", f"{management}?batch_size=4").status == 200
    assert call("PUT", f"{management}?min_worker=2&synchronous=true").status == 200
    [new] = [w for w in workers(server, "noop") if w["pid"] != old["pid"]]
    new_parent = psutil.Process(new["pid"]).ppid()
    assert new_parent != old_parent and watched.is_running()
    text = call("GET", f"{server.metrics_url}/metrics").body.decode()
    assert f'model_name="noop",model_version="1.0",worker_id="parent-{old_parent}"' in text
    os.kill(old["pid"], signal.SIGKILL)
    [replaced] = [w for w in wait_for_workers(server, "noop", {old["pid"]}) if w["pid"] != new["pid"]]
    assert psutil.Process(replaced["pid"]).ppid() == new_parent
    gone, _ = psutil.wait_procs([watched], timeout=10)
    assert gone, "the old parent outlived its last worker"
