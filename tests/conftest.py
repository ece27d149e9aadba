"""Fixtures that start real servetune servers (subprocesses, ephemeral ports) for tests."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

import ray_cluster
from servetune.embedded import EmbeddedServer


class RunningServer(EmbeddedServer):
    """An embedded server as tests use it: the key file in its workdir, and no orphans allowed at stop."""

    @property
    def token(self) -> str | None:
        key_file = self.workdir / "key_file.json"
        return str(json.loads(key_file.read_text())["management"]["key"]) if key_file.exists() else None

    def auth(self) -> dict[str, str]:
        return self.auth_headers()

    def worker_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)] if self.proc else []
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:  # type: ignore[override]
        """Stop the server; return its exit code. Fails the test if a worker process outlives it."""
        pids = self.worker_pids()
        if self.proc is not None and self.proc.poll() is None and sig != signal.SIGTERM:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        code = super().stop(timeout)

        def alive() -> list[int]:
            return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

        deadline = time.monotonic() + 10
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(), f"orphan worker processes after the server stopped: {alive()}"
        return code


@pytest.fixture(scope="session", autouse=True)
def _variant_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Variants built by tests (and by the servers they start, which inherit the environment) are cached in the
    session's own directory, never in the user's ``~/.cache/servetune/variants``."""
    before = os.environ.get("SERVETUNE_VARIANT_CACHE")
    os.environ["SERVETUNE_VARIANT_CACHE"] = str(tmp_path_factory.mktemp("variant-cache"))
    yield
    if before is None:
        os.environ.pop("SERVETUNE_VARIANT_CACHE", None)
    else:
        os.environ["SERVETUNE_VARIANT_CACHE"] = before


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """Start ``servetune serve`` on ephemeral ports: ``start_server(model_store=..., models={...}, properties={...})``.

    One worker per start-up model unless ``properties`` says otherwise; token authorization is off unless
    ``properties`` turns it on (``disable_token_authorization=false``). Every server started is stopped at the
    end, and must leave no worker process behind.
    """
    servers: list[RunningServer] = []

    def start(
        model_store: Path | None = None,
        models: dict[str, str] | None = None,
        properties: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> RunningServer:
        props = {"disable_token_authorization": "true", "default_workers_per_model": "1", **(properties or {})}
        workdir = tmp_path / f"server{len(servers)}"
        server = RunningServer(
            model_store, models, props, workdir=workdir, startup_timeout=timeout, fail_on_model_error=False
        )
        servers.append(server)
        return server.start()  # type: ignore[return-value]

    yield start
    for server in servers:
        server.stop()


# The suite runs on two xdist workers, a whole test file to a worker (``--dist loadfile --no-loadscope-reorder``:
# a module's server starts once), the longest files first. Tests on Ray (a Ray instance, a dozen processes) hold a
# lock while they run, so that two never run at once on two cores, and a test marked ``alone`` runs with the machine
# to itself (``pytest_runtest_protocol``). So that no worker waits for the other's Ray lock, the files with tests on
# Ray all go to the first worker, one after another from the start (``RayOnOneWorker``), and the other worker takes
# the rest, longest first; the file whose tests are ``alone`` comes last of the Ray files, when mypy (which
# ``scripts/check`` runs beside the tests, holding a share of the machine) has long finished.
LONGEST_FIRST = [
    "test_api_backends.py",  # Ray
    "test_api_readiness.py",  # Ray
    "test_ray_serve.py",  # Ray
    "test_tune_ray.py",  # Ray, alone
    "test_pt2.py",
    "test_animated_drawings.py",
    "test_tune_e2e.py",
    "test_tune_protocols.py",
    "test_tune_app_e2e.py",
    "test_tune_trust.py",
    "test_server_management.py",
    "test_server_faults.py",
    "test_api_kserve.py",
    "test_server_fuzz.py",
    "test_bench_async_engine.py",
    "test_control_server.py",
    "test_bench_pipeline.py",
    "test_optimize_variants.py",
]
RAY_FILES = {"test_tune_ray.py", "test_ray_serve.py"}


def ray_nodeid(nodeid: str) -> bool:
    """A test that runs on Ray: in a Ray file, or a backend-parametrized test's ``ray`` case."""
    return Path(nodeid.split("::", 1)[0]).name in RAY_FILES or "[ray]" in nodeid or "[ray-" in nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the files that have tests on Ray kept for the first worker (``RayOnOneWorker``)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayOnOneWorker(LoadFileScheduling):  # type: ignore[misc]
        """xdist's file scheduling, but the first worker takes the files with tests on Ray (in the queue's order)
        while any remain, and the other worker the files without; a worker with none of its own kind left takes
        the other kind (a Ray file then waits for the lock, as before)."""

        def _assign_work_unit(self, node: Any) -> None:
            ray = [scope for scope, unit in self.workqueue.items() if any(ray_nodeid(n) for n in unit)]
            other = [scope for scope in self.workqueue if scope not in ray]
            first, second = (ray, other) if node is self.nodes[0] else (other, ray)
            scope = (first or second)[0]
            self.workqueue.move_to_end(scope, last=False)  # the base class takes the queue's first unit
            super()._assign_work_unit(node)

    return RayOnOneWorker(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's controller (or the only process): its workers inherit this
        os.environ.setdefault(ray_cluster.RUN_ENV, uuid.uuid4().hex)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        ray_cluster.stop_shared()  # the Ray cluster the run's tests shared, if one started it
        for lock in Path(tempfile.gettempdir()).glob(f"servetune-tests-{os.environ[ray_cluster.RUN_ENV]}.*.lock"):
            lock.unlink(missing_ok=True)  # the run's lock files (machine_share, the Ray lock): every worker is gone


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


RAY_LOCK: list[IO[str]] = []  # the Ray lock while this worker holds it
MACHINE_LOCK = "SERVETUNE_TEST_MACHINE_LOCK"  # the machine's lock file, when the run's caller shares it


@contextlib.contextmanager
def machine_share(run: str, alone: bool) -> Iterator[None]:
    """Each test holds a share of the machine while it runs; a test marked ``alone`` (it asserts what measured speed
    decides) holds all of it: the other worker's test in progress finishes first, and its next waits at a turnstile
    that the ``alone`` test holds, so a stream of short tests cannot keep it waiting. ``scripts/check`` names the
    machine's lock (``MACHINE_LOCK``) and runs mypy holding a share of it too."""
    base = Path(tempfile.gettempdir()) / f"servetune-tests-{run}"
    machine_lock = os.environ.get(MACHINE_LOCK) or f"{base}.machine.lock"
    with open(f"{base}.turnstile.lock", "a") as turnstile, open(machine_lock, "a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # closing the files releases what is still held


def on_ray(item: pytest.Item) -> bool:
    return ray_nodeid(item.nodeid)


RAY_RUN: set[str] = set()  # the Ray tests this process has run


def ray_done(item: pytest.Item) -> None:
    """After a Ray test's teardown: when this process has run every Ray test of the run (all of them go to the first
    worker, ``RayOnOneWorker``), the run's cluster stops now rather than at the run's end, where its dozen processes
    would keep taking CPU from the tests still to come (a later Ray test would start another)."""
    if not on_ray(item):
        return
    RAY_RUN.add(item.nodeid)
    if RAY_RUN >= {i.nodeid for i in item.session.items if on_ray(i)}:
        ray_cluster.stop_shared()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A run of consecutive Ray tests of one file holds the Ray lock from its first test to the teardown of its last:
    a module's server on the run's shared cluster (ray_cluster.py) is never disturbed by another file's."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: nothing to share the machine with
        try:
            return (yield)
        finally:
            ray_done(item)
    run = os.environ[ray_cluster.RUN_ENV]
    alone = item.get_closest_marker("alone") is not None
    if not on_ray(item):
        with machine_share(run, alone):
            return (yield)
    if not RAY_LOCK:  # taken before the machine's share, always: two workers never wait on each other's
        lock = open(Path(tempfile.gettempdir()) / f"servetune-tests-{run}.ray.lock", "a")  # noqa: SIM115
        fcntl.flock(lock, fcntl.LOCK_EX)
        RAY_LOCK.append(lock)
    try:
        with machine_share(run, alone):
            return (yield)
    finally:
        if nextitem is None or nextitem.path != item.path or not on_ray(nextitem):
            RAY_LOCK.pop().close()  # closing the file releases the lock
        ray_done(item)
