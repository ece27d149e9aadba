"""Handlers: the contract between a worker and model code, the built-in handlers, the ``ts.*`` alias.

The worker calls ``load_service(...)`` once and ``Service.predict(batch)`` per batch. Handler classes live
in their own modules (``servetune.handlers.base.BaseHandler``, ``...image_classifier.ImageClassifier``, ...)
so that importing this package does not import torch. See docs/handlers.md.
"""

from __future__ import annotations

from servetune.handlers.compat import install_ts_alias, uninstall_ts_alias
from servetune.handlers.context import Context, RequestProcessor
from servetune.handlers.control import Control
from servetune.handlers.loader import BUILTIN_HANDLERS
from servetune.handlers.metrics import MetricsCache
from servetune.handlers.service import InputParam, Request, Response, Service, load_service
from servetune.handlers.util import BadInputError, PredictionException

__all__ = [
    "BUILTIN_HANDLERS",
    "BadInputError",
    "Context",
    "Control",
    "InputParam",
    "MetricsCache",
    "PredictionException",
    "Request",
    "RequestProcessor",
    "Response",
    "Service",
    "install_ts_alias",
    "load_service",
    "uninstall_ts_alias",
]
