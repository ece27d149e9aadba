"""Intermediate answers from a handler: the module that ``ts.handler_utils.utils`` resolves to.

A handler calls ``send_intermediate_predict_response(ret, context.request_ids, message, code, context)`` any number
of times while it runs, then returns its final answers as usual. Each call hands one answer per request of the batch
to the worker's ``context.partial_sink``; the frontend passes it on to a streaming request (gRPC
StreamPredictions) and drops it for any other (a REST request gets the final answer only).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from servetune.handlers.codec import UnsupportedOutputError, encode_value, error_body
from servetune.handlers.context import Context

__all__ = ["import_class", "send_intermediate_predict_response"]

logger = logging.getLogger(__name__)


def send_intermediate_predict_response(
    ret: Sequence[Any] | None, req_id_map: Mapping[int, str], message: str, code: int, context: Context
) -> None:
    """Send ``ret[idx]`` to request ``req_id_map[idx]`` now, as TorchServe's function of the same name: status
    ``code`` when it is an error (>= 300), else the status the handler set for that request (200 by default)."""
    sink = context.partial_sink
    if sink is None:
        return  # no frontend listening (a handler run outside a worker)
    for idx, request_id in req_id_map.items():
        if ret is None or code >= 300:
            status = code if code >= 300 else 500
            sink(str(request_id), status, error_body(status, "InternalServerException", message), "application/json")
            continue
        try:
            body, implied = encode_value(ret[idx])
        except UnsupportedOutputError:
            logger.warning("model %s: unable to serialize an intermediate answer", context.model_name, exc_info=True)
            unsupported = error_body(503, "InternalServerException", "Unsupported model output data type.")
            sink(str(request_id), 503, unsupported, "application/json")
            continue
        status, _ = context.get_response_status(idx) if context.request_processor else (200, None)
        content_type = context.get_response_content_type(idx) if context.request_processor else None
        sink(str(request_id), int(status or 200), body, content_type or implied)


def import_class(class_name: str, module_prefix: str | None = None) -> type:
    """``"package.module.Class"`` (or ``"Class"`` under ``module_prefix``) -> the class, as TorchServe's helper."""
    if not class_name:
        raise ImportError("class name is not defined")
    module_name, _, name = class_name.rpartition(".")
    if module_prefix:
        module = importlib.import_module(f"{module_prefix}.{module_name}" if module_name else module_prefix)
    elif module_name:
        module = importlib.import_module(module_name)
    else:
        raise ImportError("module name is not defined.")
    found = getattr(module, name, None)
    if found is None:
        raise ImportError(f"class:{name} not found in module:{module_name}.")
    return found  # type: ignore[no-any-return]
