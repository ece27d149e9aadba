"""Management API parameters, read as TorchServe 0.12 reads them (``ManagementRequestHandler``, ``ApiUtils``,
``RegisterModelRequest``, ``NettyUtils.getIntParameter``):

- an integer that does not parse (``batch_size=dd``, ``min_worker=nan``) is "not given": the default applies;
- a boolean is true only for ``true`` in any case (Java's ``Boolean.parseBoolean``): ``synchronous=Nan`` is false;
- ``initial_workers`` <= 0 registers with 0 workers; ``startup_timeout=0`` is accepted.

Where TorchServe answers a value with an internal error (``min_worker=-1``: 500) or stores a value that cannot work
(``batch_size=0``), servetune answers 400 naming the parameter (docs/torchserve-compat.md lists each).
servetune's own extensions (``PUT ?batch_size=&max_batch_delay=&num_threads=&inter_op_threads=&cpu_pinning=``) are
validated strictly: a value that does not parse is an error, not a silent default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.requests import Request

from servetune._exceptions import ApiError
from servetune.api.plan import RUNTIMES, RegisterParams
from servetune.api.types import Reconfigure

LIMIT = 1_000_000  # the largest batch size, delay or timeout servetune accepts
PAGE_LIMIT = 100  # TorchServe's default and largest page of GET /models


async def request_params(request: Request) -> dict[str, str]:
    """Query parameters, and the same names in a JSON body (TorchServe reads its register request from either)."""
    params = dict(request.query_params)
    if (request.headers.get("content-type") or "").startswith("application/json"):
        raw = await request.body()
        if raw.strip():
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ApiError.bad_request(f"Invalid JSON body: {exc.msg}") from None
            if not isinstance(body, dict):
                raise ApiError.bad_request("JSON body must be an object")
            params.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in body.items()})
    return params


def lenient_int(params: Mapping[str, str], key: str) -> int | None:
    """TorchServe's rule: a value that is not an integer counts as not given."""
    raw = params.get(key)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


def java_bool(params: Mapping[str, str], key: str, default: bool) -> bool:
    """Java's ``Boolean.parseBoolean``: true only for "true", ignoring case."""
    raw = params.get(key)
    return default if raw is None else raw.strip().lower() == "true"


def _in_range(key: str, value: int | None, minimum: int) -> int | None:
    if value is not None and not minimum <= value <= LIMIT:
        raise ApiError.bad_request(f"{key} must be between {minimum} and {LIMIT}, got {value}")
    return value


def _timeout(params: Mapping[str, str], key: str, minimum: int) -> int | None:
    """-1 (TorchServe's "not given") and unparsable values mean the default."""
    value = lenient_int(params, key)
    return None if value == -1 else _in_range(key, value, minimum)


def register_params(params: Mapping[str, str], max_workers_per_model: int) -> RegisterParams:
    """``POST /models``: the register request, validated before anything is read or downloaded."""
    url = params.get("url")
    if url is None:
        raise ApiError.bad_request("Parameter url is required.")
    runtime = params.get("runtime")
    if runtime is not None and runtime not in RUNTIMES:
        raise ApiError.bad_request(f"Invalid RuntimeType value: {runtime}")
    workers = lenient_int(params, "initial_workers")
    if workers is not None and workers > max_workers_per_model:
        raise ApiError.bad_request(f"Workers are limited to max_workers_per_model={max_workers_per_model} per model.")
    return RegisterParams(
        url=url,
        model_name=params.get("model_name") or None,
        handler=params.get("handler") or None,
        runtime=runtime,
        batch_size=_in_range("batch_size", lenient_int(params, "batch_size"), 1),
        max_batch_delay=_in_range("max_batch_delay", lenient_int(params, "max_batch_delay"), 0),
        initial_workers=None if workers is None else max(0, workers),
        response_timeout=_timeout(params, "response_timeout", 1),
        startup_timeout=_timeout(params, "startup_timeout", 0),
        synchronous=java_bool(params, "synchronous", True),
    )


def scale_params(params: Mapping[str, str], max_workers_per_model: int) -> tuple[int, int]:
    """``min_worker`` (default 1) and ``max_worker`` (default min) of ``PUT /models/{name}``."""
    min_worker = lenient_int(params, "min_worker")
    min_worker = 1 if min_worker is None else min_worker
    max_worker = lenient_int(params, "max_worker")
    max_worker = min_worker if max_worker is None else max_worker
    if min_worker < 0:
        raise ApiError.bad_request("min_worker cannot be negative.")
    if max_worker < min_worker:
        raise ApiError.bad_request("max_worker cannot be less than min_worker.")
    if max_worker > max_workers_per_model:
        raise ApiError.bad_request(f"Workers are limited to max_workers_per_model={max_workers_per_model} per model.")
    return min_worker, max_worker


def _strict_int(params: Mapping[str, str], key: str, minimum: int) -> int | None:
    raw = params.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ApiError.bad_request(f"{key} must be an integer, got {raw!r}") from None
    return _in_range(key, value, minimum)


def reconfigure_params(params: Mapping[str, str]) -> Reconfigure:
    """servetune's in-place changes in ``PUT /models/{name}``; TorchServe changes these only by registering anew."""
    pinning = params.get("cpu_pinning")
    if pinning is not None and pinning.strip().lower() not in ("true", "false"):
        raise ApiError.bad_request(f"cpu_pinning must be true or false, got {pinning!r}")
    return Reconfigure(
        batch_size=_strict_int(params, "batch_size", 1),
        max_batch_delay_ms=_strict_int(params, "max_batch_delay", 0),
        num_threads=_strict_int(params, "num_threads", 0),
        inter_op_threads=_strict_int(params, "inter_op_threads", 0),
        cpu_pinning=None if pinning is None else pinning.strip().lower() == "true",
    )


def page(params: Mapping[str, str], total: int) -> tuple[int, int]:
    """``GET /models`` paging: (start, limit); ``limit`` <= 0 or > 100 means 100, a negative token means 0."""
    limit = lenient_int(params, "limit") or PAGE_LIMIT
    limit = PAGE_LIMIT if limit <= 0 or limit > PAGE_LIMIT else limit
    start = max(0, lenient_int(params, "next_page_token") or 0)
    return min(start, total), limit


__all__ = [
    "java_bool",
    "lenient_int",
    "page",
    "reconfigure_params",
    "register_params",
    "request_params",
    "scale_params",
]
