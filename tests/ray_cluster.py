"""A real Ray cluster for tests: a head and extra node processes on this machine, started with ``ray start`` and
stopped by the process ids they started (never ``ray stop``, which would stop every Ray cluster on the machine).

    from ray_cluster import cluster_fixture  # noqa: F401  (the module-scoped fixture ``cluster``)

One two-node cluster serves the whole test run (``shared_cluster``): the first test that asks starts it, on whichever
xdist worker, and the run's end stops it (``stop_shared``, from tests/conftest.py). Tests on Ray run one at a time
(the Ray lock in tests/conftest.py), and each servetune server on it shuts its Serve instance down when it stops.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

START_TIMEOUT_S = 120.0
# Ray turns token authentication on when ~/.ray/auth_token exists (a local ray.init() writes one): say it for every
# process of the test cluster, the driver included, so that the machine's history does not matter.
AUTH_MODE = "disabled"


def _free_ports(n: int, taken: set[int]) -> list[int]:
    """``n`` free ports, none of them in ``taken`` (which they join): Ray refuses a port given to two of its
    components, and the kernel hands a port closed a moment ago out again."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in taken:
                ports.append(port)
                taken.add(port)
        return ports
    finally:
        for s in socks:
            s.close()


class LocalRayCluster:
    """A head and extra node processes started with ``ray start``; stopped by the pids they started."""

    def __init__(self, head_cpus: int = 2, node_cpus: tuple[int, ...] = (1,)) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths are long
        self.head_cpus = head_cpus
        self.node_cpus = node_cpus
        self.gcs_port = 0
        self.address = ""
        self.log: list[str] = []
        self._ports: set[int] = set()  # every port given to this cluster's processes

    def _ray_start(self, args: list[str]) -> None:
        ports = _free_ports(4, self._ports)
        command = [
            shutil.which("ray") or "ray",
            "start",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={ports[0]}",
            f"--dashboard-agent-grpc-port={ports[1]}",
            f"--metrics-export-port={ports[2]}",
            f"--runtime-env-agent-port={ports[3]}",
            *args,
        ]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": AUTH_MODE}
        # One proxy (the head's) takes every request here, where a real cluster has one per node behind a load
        # balancer: without this, it would keep requests on the head's replicas while the other node's idle.
        env["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
        env.pop("RAY_ADDRESS", None)
        # servetune's proxy middleware (Ray's own plain-text errors answered as TorchServe's JSON), as
        # docs/scale-out.md tells operators to set it where their cluster starts
        env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] = "servetune.ray.proxy_errors:middlewares"
        done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S, env=env, check=False)
        self.log.append(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> LocalRayCluster:
        self.gcs_port, client_port, dashboard_port = _free_ports(3, self._ports)
        self._ray_start(
            [
                "--head",
                f"--port={self.gcs_port}",
                f"--ray-client-server-port={client_port}",
                f"--dashboard-port={dashboard_port}",
                "--include-dashboard=false",
                f"--num-cpus={self.head_cpus}",
                "--num-gpus=0",
                "--object-store-memory=200000000",
                f"--temp-dir={self.temp_dir}",
            ]
        )
        # the head advertises the machine's address, whatever --node-ip-address says: read it back
        for line in self.log[-1].splitlines():
            if "ray start --address='" in line:
                self.address = line.split("--address='")[1].split("'")[0]
        self.address = self.address or f"127.0.0.1:{self.gcs_port}"
        for cpus in self.node_cpus:
            self._ray_start(
                [f"--address={self.address}", f"--num-cpus={cpus}", "--num-gpus=0", "--object-store-memory=100000000"]
            )
        return self

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: those naming its temp dir or GCS port, and their descendants."""
        marks = (str(self.temp_dir), f":{self.gcs_port}")
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if self.gcs_port and any(m in cmdline for m in marks):
                found[proc.pid] = proc
                try:
                    found.update({c.pid: c for c in proc.children(recursive=True)})
                except psutil.NoSuchProcess:
                    pass
        return [p for p in found.values() if p.pid != os.getpid()]

    def state(self) -> dict[str, object]:
        return {"temp_dir": str(self.temp_dir), "gcs_port": self.gcs_port, "address": self.address}

    @classmethod
    def attach(cls, state: dict[str, object]) -> LocalRayCluster:
        """The cluster another process started, from its ``state()``."""
        cluster = cls.__new__(cls)
        cluster.temp_dir = Path(str(state["temp_dir"]))
        cluster.gcs_port = int(str(state["gcs_port"]))
        cluster.address = str(state["address"])
        cluster.head_cpus, cluster.node_cpus, cluster.log, cluster._ports = 0, (), [], set()
        return cluster

    def stop(self) -> None:
        procs = self.processes()
        for proc in procs:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=2)  # some of Ray's processes never exit on SIGTERM
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


RUN_ENV = "SERVETUNE_TEST_RUN"  # set once per test run by tests/conftest.py, inherited by the xdist workers


def _state_file() -> Path:
    return Path(tempfile.gettempdir()) / f"servetune-tests-{os.environ.get(RUN_ENV, os.getpid())}.ray-cluster.json"


def shared_cluster() -> LocalRayCluster:
    """The run's cluster: a head (3 CPUs) and a second node (1 CPU), started by the first caller of any process (the
    API suite's Ray server holds a replica on each of 4 CPUs at most)."""
    state = _state_file()
    with open(state.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if state.exists():
            return LocalRayCluster.attach(json.loads(state.read_text()))
        cluster = LocalRayCluster(head_cpus=3).start()
        state.write_text(json.dumps(cluster.state()))
        return cluster


def stop_shared() -> None:
    """Stop the run's cluster, if a test started one (the run's end)."""
    state = _state_file()
    if not state.exists():
        return
    cluster = LocalRayCluster.attach(json.loads(state.read_text()))
    cluster.stop()
    state.unlink()
    state.with_suffix(".lock").unlink(missing_ok=True)
    assert not cluster.processes(), "Ray processes outlived the cluster"


@pytest.fixture(scope="module", name="cluster")
def cluster_fixture() -> Iterator[LocalRayCluster]:
    """The run's cluster (``shared_cluster``), with Ray's auth mode set for the module's servers."""
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = AUTH_MODE  # inherited by the driver subprocess
    try:
        yield shared_cluster()
    finally:
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def run_cli_without_ray(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``servetune ARGS`` in a fresh interpreter where ``import ray`` fails as if Ray were not installed (a None entry
    in sys.modules)."""
    import sys

    code = f"import sys; sys.modules['ray'] = None; from servetune.cli import main; main({args!r})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
