"""``EmbeddedServer`` on the Ray backend: a ``servetune serve --backend ray`` subprocess for benchmarks and the tuner.

with EmbeddedRayServer(model_store, models={"m": "m.mar"}, properties={...}, ray_address="host:port") as server:
    server.inference_url, server.management_url
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servetune.server.embedded import EmbeddedServer


class EmbeddedRayServer(EmbeddedServer):
    """The same lifecycle and output parsing as ``EmbeddedServer``; ``ray_address=None`` starts a local cluster
    inside the server process (stopped with it). It has no metrics API (Ray exports its own metrics)."""

    def __init__(
        self,
        model_store: Path | None = None,
        models: Mapping[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        *,
        ray_address: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model_store, models, properties, **kwargs)
        self.ray_address = ray_address

    def start(self) -> EmbeddedRayServer:
        # EmbeddedServer passes this process's environment on: select the backend through the CLI's env vars.
        saved = {key: os.environ.get(key) for key in ("SERVETUNE_BACKEND", "RAY_ADDRESS")}
        os.environ["SERVETUNE_BACKEND"] = "ray"
        if self.ray_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = self.ray_address
        try:
            super().start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return self


__all__ = ["EmbeddedRayServer"]
