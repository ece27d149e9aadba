"""Management API parameters, read as TorchServe 0.12 reads them (``ManagementRequestHandler``, ``ApiUtils``,
``RegisterModelRequest``, ``NettyUtils.getIntParameter``):

- an integer is what Java's ``Integer.parseInt`` reads (:func:`java_int`): an optional sign and ASCII digits within
  32 bits; no spaces, no ``_``, no ``0x``. One that does not parse (``batch_size=dd``, ``min_worker=1_0``,
  ``min_worker=2147483648``) is "not given": the default applies, as ``getIntParameter`` does;
- a boolean is true only for ``true`` in any case (Java's ``Boolean.parseBoolean``): ``synchronous=Nan`` is false;
- ``initial_workers`` <= 0 registers with 0 workers; ``startup_timeout=0`` is accepted.

Where TorchServe answers a value with an internal error (``min_worker=-1``: 500) or stores a value that cannot work
(``batch_size=0``), servetune answers 400 naming the parameter (docs/torchserve-compat.md lists each); the bounds and
their wording are the model-config.yaml keys' (``servetune.config.model``). servetune's own extensions (``PUT
?batch_size=&max_batch_delay=&num_threads=&inter_op_threads=&cpu_pinning=&timeout=``) are validated strictly: a value
that does not parse is an error, not a silent default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from starlette.requests import Request

from servetune._exceptions import ApiError, ArchiveError
from servetune.api.plan import RUNTIMES, RegisterParams
from servetune.api.types import Reconfigure
from servetune.archive import validate_model_name
from servetune.config.model import JAVA_INT_MAX, LIMIT, out_of_range, shown

PAGE_LIMIT = 100  # TorchServe's default and largest page of GET /models
_JAVA_INT = re.compile(r"[+-]?0*([0-9]{1,10})")  # ASCII digits only (re's [0-9]); at most 10 significant digits


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


def java_int(raw: str) -> int | None:
    """``raw`` as Java's ``Integer.parseInt`` reads it, or None where it throws. One difference, on purpose: Java also
    takes other scripts' decimal digits (``١٠`` is 10); here only ASCII digits count (docs/torchserve-compat.md)."""
    match = _JAVA_INT.fullmatch(raw)
    if match is None:
        return None
    value = int(match.group(1)) * (-1 if raw.startswith("-") else 1)
    return value if -JAVA_INT_MAX - 1 <= value <= JAVA_INT_MAX else None


def lenient_int(params: Mapping[str, str], key: str) -> int | None:
    """TorchServe's rule (``NettyUtils.getIntParameter``): a value ``Integer.parseInt`` refuses counts as not given."""
    raw = params.get(key)
    return None if raw is None else java_int(raw)


def java_bool(params: Mapping[str, str], key: str, default: bool) -> bool:
    """Java's ``Boolean.parseBoolean``: true only for "true", ignoring case."""
    raw = params.get(key)
    return default if raw is None else raw.strip().lower() == "true"


def _in_range(key: str, value: int | None, minimum: int, maximum: int = LIMIT, *, workers: bool = False) -> int | None:
    if value is not None and not minimum <= value <= maximum:
        raise ApiError.bad_request(out_of_range(key, value, minimum, maximum, workers=workers))
    return value


def model_name(name: str | None) -> str | None:
    """A model name as the register API takes it: TorchServe's archiver rule, ``^[A-Za-z0-9][A-Za-z0-9_\\-.]*$``;
    ApiError 400 for any other (``a/b`` could not be reached over REST; control and bidi characters mislead)."""
    if name is None:
        return None
    try:
        return validate_model_name(name)
    except ArchiveError as exc:
        raise ApiError.bad_request(str(exc)) from None


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
        raise ApiError.bad_request(out_of_range("initial_workers", workers, 0, max_workers_per_model, workers=True))
    return RegisterParams(
        url=url,
        model_name=model_name(params.get("model_name") or None),
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
    _in_range("min_worker", min_worker, 0, max_workers_per_model, workers=True)
    if max_worker < min_worker:
        raise ApiError.bad_request("max_worker cannot be less than min_worker.")
    _in_range("max_worker", max_worker, 0, max_workers_per_model, workers=True)
    return min_worker, max_worker


def strict_int(params: Mapping[str, str], key: str, minimum: int) -> int | None:
    """servetune's own parameters: an integer as :func:`java_int` reads it, within ``minimum``..LIMIT; ApiError 400
    for anything else (a value of 400 digits included: its range is named, never a 500)."""
    raw = params.get(key)
    if raw is None:
        return None
    value = java_int(raw)
    if value is None:
        if re.fullmatch(r"[+-]?[0-9]+", raw):  # digits beyond 32 bits: out of range, not malformed
            raise ApiError.bad_request(out_of_range(key, raw, minimum, LIMIT))
        raise ApiError.bad_request(f"{key} must be an integer, got {shown(repr(raw))}")
    return _in_range(key, value, minimum)


def reconfigure_params(params: Mapping[str, str]) -> Reconfigure:
    """servetune's in-place changes in ``PUT /models/{name}``; TorchServe changes these only by registering anew."""
    pinning = params.get("cpu_pinning")
    if pinning is not None and pinning.strip().lower() not in ("true", "false"):
        raise ApiError.bad_request(f"cpu_pinning must be true or false, got {pinning!r}")
    return Reconfigure(
        batch_size=strict_int(params, "batch_size", 1),
        max_batch_delay_ms=strict_int(params, "max_batch_delay", 0),
        num_threads=strict_int(params, "num_threads", 0),
        inter_op_threads=strict_int(params, "inter_op_threads", 0),
        cpu_pinning=None if pinning is None else pinning.strip().lower() == "true",
    )


def scale_timeout(params: Mapping[str, str]) -> int | None:
    """servetune's ``timeout`` of a synchronous scale (seconds; TorchServe ignores the parameter, its own tests send
    ``timeout=-1`` and ``timeout=0``): a value <= 0 or not a number is "not given"; a number above LIMIT, however
    many digits it has, is ApiError 400."""
    raw = params.get("timeout")
    if raw is None:
        return None
    value = java_int(raw)
    if (value is None and re.fullmatch(r"[+-]?[0-9]+", raw) and not raw.startswith("-")) or (
        value is not None and value > LIMIT
    ):
        raise ApiError.bad_request(out_of_range("timeout", raw, 1, LIMIT))
    return value if value is not None and value > 0 else None


def page(params: Mapping[str, str], total: int) -> tuple[int, int]:
    """``GET /models`` paging: (start, limit); ``limit`` <= 0 or > 100 means 100, a negative token means 0."""
    limit = lenient_int(params, "limit") or PAGE_LIMIT
    limit = PAGE_LIMIT if limit <= 0 or limit > PAGE_LIMIT else limit
    start = max(0, lenient_int(params, "next_page_token") or 0)
    return min(start, total), limit


__all__ = [
    "java_bool",
    "java_int",
    "lenient_int",
    "model_name",
    "page",
    "reconfigure_params",
    "register_params",
    "request_params",
    "scale_params",
    "scale_timeout",
    "strict_int",
]
