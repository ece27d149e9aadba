"""The contract between the worker process and a handler: ``load_service`` once, then ``Service.predict`` per batch.

``predict`` never raises and always answers one ``Response`` per ``Request``. Errors take TorchServe's
JSON shape ``{"code": N, "type": "...", "message": "..."}``. One bad request does not fail its batch:
inputs that cannot be decoded are answered 400 before the handler runs, and if ``handle`` raises for a
batch of several requests, each request is run again alone so that only the offending ones fail.

A batch is split by each request's typed control (``servetune.handlers.control``: protocol, explain, describe):
requests of different kinds never share a handler call, so nothing one client sends changes how another client's
request is handled. An explain request to a handler that cannot explain is answered 501 without calling it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import servetune
from servetune._exceptions import HandlerError
from servetune.handlers.codec import UnsupportedOutputError, decode_value, encode_value, error_body
from servetune.handlers.compat import install_ts_alias
from servetune.handlers.context import Context, RequestProcessor
from servetune.handlers.control import DEFAULT, KSERVE_V1, OIP_V2, Control, handler_explains, handler_headers
from servetune.handlers.envelopes import handler_metadata, with_envelopes
from servetune.handlers.loader import EntryPoint, forget_shadowed_modules, import_handler_module, resolve_entry_point
from servetune.handlers.metrics import MetricsCache
from servetune.handlers.util import BadInputError, PredictionException
from servetune.tensor_limits import TensorLimits

__all__ = ["InputParam", "Request", "Response", "Service", "import_handler", "load_service"]

logger = logging.getLogger(__name__)

_IMPORTING = threading.Lock()  # ``import_handler``
PREDICTION_METRIC = "PredictionTime"


@dataclass(frozen=True)
class InputParam:
    """One input of a request: ``name`` is ``"body"`` for a raw body, else the form field (or query) name."""

    name: str
    content_type: str | None
    data: bytes


@dataclass(frozen=True)
class Request:
    request_id: str
    headers: dict[str, str]  # the client's; the handler sees them through ``handler_headers``
    inputs: list[InputParam]
    control: Control = DEFAULT


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str | None
    headers: dict[str, str] = field(default_factory=dict)
    #: the HTTP reason phrase a handler set with ``context.set_response_status(code, phrase, idx)``
    reason: str | None = None


def error_response(code: int, message: str, error_type: str = "InternalServerException") -> Response:
    return Response(code, error_body(code, error_type, message), "application/json", {})


class Service:
    """A loaded handler bound to its ``Context``."""

    def __init__(
        self,
        context: Context,
        entry_point: EntryPoint,
        *,
        decode_input_request: bool = True,
        explains: bool = True,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self._context = context
        self._entry_point = entry_point
        self._decode = decode_input_request
        self._explains = explains  # False: explain requests are answered 501 without calling the handler
        # what the handler's ``model_metadata()`` answered once loaded (the OIP tensors it declares), or None
        self.metadata = metadata

    @property
    def context(self) -> Context:
        return self._context

    def predict(self, batch: list[Request]) -> list[Response]:
        """Run ``handle`` on the batch; exactly ``len(batch)`` responses, in order. Never raises ``Exception``."""
        try:
            return self._predict(batch)
        except Exception:  # a bug on our side or a handler breaking the context: answer, don't crash the worker
            logger.exception("model %s: unexpected failure while predicting", self._context.model_name)
            return [error_response(503, "Prediction failed") for _ in batch]

    def _predict(self, batch: list[Request]) -> list[Response]:
        responses: list[Response | None] = [None] * len(batch)
        groups: dict[tuple[str, bool, bool], tuple[list[int], list[dict[str, Any]]]] = {}
        for i, request in enumerate(batch):
            if request.control.explain and not self._explains:
                message = f"{self._context.model_name}'s handler does not provide explanations"
                responses[i] = error_response(501, message, "ModelException")
                continue
            try:
                row = self._decode_request(request)
            except BadInputError as exc:
                message = f"request {request.request_id}: {exc.message}"
                responses[i] = error_response(exc.error_code, message, exc.error_type)
                continue
            indices, rows = groups.setdefault(request.control.key, ([], []))
            indices.append(i)
            rows.append(row)
        for indices, rows in groups.values():  # one handler call per kind, in order of first appearance
            for i, response in zip(indices, self._run([batch[i] for i in indices], rows), strict=True):
                responses[i] = response
        return [r if r is not None else error_response(503, "Prediction failed") for r in responses]

    def _decode_request(self, request: Request) -> dict[str, Any]:
        strict = request.control.protocol == KSERVE_V1  # KServe's body is strict JSON (NaN is not JSON)
        return {
            p.name: decode_value(p.name, p.content_type, p.data, decode=self._decode, strict=strict)
            for p in request.inputs
        }

    def _run(self, requests: list[Request], rows: list[dict[str, Any]]) -> list[Response]:
        ctx = self._context
        ctx.request_ids = {i: r.request_id for i, r in enumerate(requests)}
        ctx.request_processor = [RequestProcessor(_request_headers(r), r.control) for r in requests]
        ctx.metrics.set_request_ids(ctx.request_ids)
        start = time.perf_counter()
        try:
            ret = self._entry_point(rows, ctx)
        except Exception as exc:  # noqa: BLE001 - any handler failure becomes an HTTP answer
            if len(requests) > 1:
                logger.warning(
                    "model %s: batch of %d failed (%s); retrying each request alone", ctx.model_name, len(requests), exc
                )
                # decoded afresh: the failed call may have mutated its input
                return [response for r in requests for response in self._run([r], [self._decode_request(r)])]
            # KServe's clients get the handler's error, as KServe's model server answers; TorchServe's routes keep
            # TorchServe's bare "Prediction failed".
            return [_exception_response(exc, detail=requests[0].control.protocol in (KSERVE_V1, OIP_V2))]
        if not isinstance(ret, list):
            logger.warning("model: %s, Invalid return type: %s.", ctx.model_name, type(ret))
            return [error_response(503, "Invalid model predict output") for _ in requests]
        if len(ret) != len(requests):
            logger.warning(
                "model: %s, number of batch response mismatched, expect: %d, got: %d.",
                ctx.model_name,
                len(requests),
                len(ret),
            )
            return [error_response(503, "number of batch response mismatched") for _ in requests]
        ctx.metrics.add_time(PREDICTION_METRIC, round((time.perf_counter() - start) * 1000.0, 2))
        return [self._encode(idx, value) for idx, value in enumerate(ret)]

    def _encode(self, idx: int, value: Any) -> Response:
        try:
            body, implied_type = encode_value(value)
        except UnsupportedOutputError:
            logger.warning("model %s: unable to serialize model output", self._context.model_name, exc_info=True)
            return error_response(503, "Unsupported model output data type.")
        code, phrase = self._context.get_response_status(idx)
        headers: dict[str, str] = {}
        content_type = implied_type
        for key, val in self._context.get_response_headers(idx).items():
            if key.lower() == "content-type":
                content_type = str(val) if val else implied_type
            else:
                headers[key] = str(val)
        return Response(int(code) if code is not None else 200, body, content_type, headers, phrase or None)


def _request_headers(request: Request) -> dict[str, Any]:
    # As TorchServe's worker: one {"content-type": ...} entry per input name, then the HTTP headers; the server's
    # control headers (``explain``, ``describe``) from the typed control, never a client's copy.
    headers: dict[str, Any] = {p.name: {"content-type": p.content_type} for p in request.inputs}
    headers.update(handler_headers(request.headers, request.control))
    return headers


def _exception_response(exc: Exception, detail: bool = False) -> Response:
    if isinstance(exc, PredictionException):
        logger.error("Prediction error", exc_info=exc)
        code = exc.error_code if isinstance(exc.error_code, int) and 100 <= exc.error_code <= 599 else 500
        return error_response(code, str(exc.message), exc.error_type)
    if isinstance(exc, MemoryError):
        logger.error("System out of memory", exc_info=exc)
        return error_response(507, "Out of resources")
    if "CUDA" in str(exc) or type(exc).__name__ == "OutOfMemoryError":
        # TorchServe's rule: "CUDA out of memory" and CUDA errors close to OOM (CUBLAS_STATUS_NOT_INITIALIZED)
        logger.error("CUDA out of memory", exc_info=exc)
        return error_response(507, "Out of resources")
    logger.warning("Invoking custom service failed.", exc_info=exc)
    return error_response(503, f"Prediction failed: {type(exc).__name__}: {exc}" if detail else "Prediction failed")


def load_service(
    *,
    model_dir: Path,
    manifest: dict[str, Any],
    model_name: str,
    gpu_id: int | None,
    batch_size: int,
    model_yaml_config: dict[str, Any],
    limit_max_image_pixels: bool = True,
    decode_input_request: bool = True,
    service_envelope: str | None = None,
    tensor_limits: TensorLimits | None = None,
) -> Service:
    """Import the handler named by ``manifest["model"]["handler"]`` and initialise it. Its entry point is wrapped by
    the request envelopes (``servetune.handlers.envelopes``: KServe v1 / OIP v2 requests, ``service_envelope``).

    Raises ``HandlerError`` carrying the handler's own error message and a traceback summary.
    """
    module, function_name, directory = import_handler(model_dir=model_dir, manifest=manifest, model_name=model_name)
    handler = _handler_name(manifest)
    context = Context(
        model_name,
        directory,
        manifest,
        batch_size,
        gpu_id,
        servetune.__version__,
        limit_max_image_pixels,
        MetricsCache(model_name),
        model_yaml_config,
    )
    if tensor_limits is not None:
        context.tensor_limits = tensor_limits
    try:
        entry_point, initialize = resolve_entry_point(module, function_name)
        initialize(context)
        _check_optimization_applied(context, handler)
    except HandlerError:
        raise
    except Exception as exc:
        raise HandlerError(f"model {model_name!r}: handler {handler!r} failed to load: {_summary(exc)}") from exc
    wrapped = with_envelopes(entry_point, module, service_envelope)
    explains = handler_explains(wrapped.owner)
    metadata = handler_metadata(wrapped.owner)
    return Service(context, wrapped, decode_input_request=decode_input_request, explains=explains, metadata=metadata)


def _check_optimization_applied(context: Context, handler: str) -> None:
    """A variant named in model-config.yaml (``optimization``) is applied by ``BaseHandler.initialize``; a handler that
    never ran it (a plain function, a class of its own) would serve the eager model under the variant's name: a load
    error instead, saying why."""
    name = context.model_yaml_config.get("optimization")
    if name and name != "eager" and not context.applies_optimization:
        raise HandlerError(
            f"model {context.model_name!r}: model-config.yaml says optimization={name!r}, but handler {handler!r} "
            "does not apply it: variants are applied by BaseHandler.initialize, which this handler (a plain function "
            "or a class of its own) never runs. Build the handler on BaseHandler (or have it call BaseHandler's "
            "initialize), or remove the key (docs/optimize.md)"
        )


def _handler_name(manifest: dict[str, Any]) -> str:
    return str((manifest.get("model") or {}).get("handler") or "").strip()


def import_handler(*, model_dir: Path, manifest: dict[str, Any], model_name: str) -> tuple[ModuleType, str | None, str]:
    """Import the handler's module, as ``load_service`` does before it initialises the handler: the model directory
    first on ``sys.path``, the ``ts`` alias installed. Returns the module, the entry point's function name (``None``:
    the module's ``handle`` or its one class) and the model directory as put on the path. Raises ``HandlerError``.

    A model-loading parent process calls it alone, so that the workers it forks find the handler's imports (torch)
    done; importing again is then a lookup in ``sys.modules``."""
    install_ts_alias()
    model_dir = Path(model_dir)
    handler = _handler_name(manifest)
    if not handler:
        raise HandlerError(f"model {model_name!r}: the manifest names no handler (model.handler)")
    directory = str(model_dir.resolve())
    # sys.path, sys.modules and the import system's caches are the interpreter's: two models loading on two threads
    # of one process (an in-process server) would change them under each other (Python 3.11's
    # importlib.invalidate_caches raised KeyError when both ran it at once)
    with _IMPORTING:
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)
        try:
            forget_shadowed_modules(model_dir)
            module, function_name = import_handler_module(handler, model_dir)
        except HandlerError:
            raise
        except Exception as exc:
            raise HandlerError(f"model {model_name!r}: handler {handler!r} failed to load: {_summary(exc)}") from exc
    return module, function_name, directory


def _summary(exc: BaseException, frames: int = 6) -> str:
    """``Type: message`` plus the innermost frames, enough to find the line in the handler."""
    tb = traceback.extract_tb(exc.__traceback__)[-frames:]
    lines = "".join(traceback.format_list(tb)).rstrip()
    return f"{type(exc).__name__}: {exc}\nTraceback (most recent call last, innermost {len(tb)} frames):\n{lines}"
