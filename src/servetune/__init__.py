"""servetune: serve PyTorch models the TorchServe way, measure them honestly, tune them to an SLA."""

from __future__ import annotations

import servetune.startup  # noqa: F401 - first: its clock times every import after it (serve --log-level debug)
from servetune._exceptions import (
    ApiError,
    ArchiveError,
    BenchError,
    ConfigError,
    HandlerError,
    OptimizeError,
    ServetuneError,
)

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "ArchiveError",
    "BenchError",
    "ConfigError",
    "HandlerError",
    "OptimizeError",
    "ServetuneError",
    "__version__",
]
