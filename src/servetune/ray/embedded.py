"""``EmbeddedServer`` on the Ray backend: a ``servetune serve --backend ray`` subprocess for benchmarks and the tuner.

with EmbeddedRayServer(model_store, models={"m": "m.mar"}, properties={...}, ray_address="host:port") as server:
    server.inference_url, server.management_url
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servetune.ray.controller import LOCAL_CPUS_ENV
from servetune.server.embedded import EmbeddedServer


class EmbeddedRayServer(EmbeddedServer):
    """The same lifecycle and output parsing as ``EmbeddedServer``. ``ray_address``: ``local`` starts a private Ray
    instance inside the server process (stopped with it; ``num_cpus`` sets the CPUs it advertises, default this
    machine's), None follows Ray's own rule (``servetune serve --backend ray`` without ``--ray-address``). It has no
    metrics API (Ray exports its own metrics)."""

    def __init__(
        self,
        model_store: Path | None = None,
        models: Mapping[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        *,
        ray_address: str | None = None,
        num_cpus: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model_store, models, properties, **kwargs)
        self.ray_address = ray_address
        self.num_cpus = num_cpus

    def start(self) -> EmbeddedRayServer:
        # The backend and the cluster reach the server through the CLI's environment variables.
        self.env.update({"SERVETUNE_BACKEND": "ray", "RAY_ADDRESS": self.ray_address})
        self.env[LOCAL_CPUS_ENV] = None if self.num_cpus is None else str(self.num_cpus)
        super().start()
        return self


__all__ = ["EmbeddedRayServer"]
