"""The backends the shared API suites run on: native always, Ray where the ray extra is installed; and ``fake``, the
API server in the test process over a fake backend (tests/inprocess.py), for the protocol suites."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from inprocess import InProcessServer
from servetune.embedded import EmbeddedServer

BACKENDS = ["native", pytest.param("ray", marks=pytest.mark.slow)]
IN_PROCESS = ["fake"]
HAS_RAY = importlib.util.find_spec("ray") is not None


def backend_server(
    backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    store: Path,
    models: dict[str, str],
    properties: dict[str, str],
    ray_address: str = "local",
) -> EmbeddedServer | InProcessServer:
    """A server (not started) of ``backend`` over ``store``; on Ray, on the cluster at ``ray_address`` (``local``: a
    private local instance with room for 4 CPUs); ``fake``: in this process. Skips the test where Ray is not
    installed."""
    if backend == "fake":
        return InProcessServer(store, models, properties, workdir=tmp_path_factory.mktemp("server-fake"))
    if backend == "ray" and not HAS_RAY:
        pytest.skip("Ray Serve is not installed (pip install 'servetune[ray]')")
    return EmbeddedServer(
        store,
        models,
        properties,
        workdir=tmp_path_factory.mktemp(f"server-{backend}"),
        backend=backend,
        ray_address=ray_address,
        ray_num_cpus=4 if ray_address == "local" else None,
        startup_timeout=240,
    )
