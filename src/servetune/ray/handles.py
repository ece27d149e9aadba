"""The one place servetune calls a Ray Serve deployment handle (the driver, the frontend and a replica reach a model
version's replicas this way when Ray's proxy did not route the request there itself), and the one rule for what a
failure on the way means: the replica died mid-request, its deployment is gone or its queue is full. Each is
answered as the native server answers it, 503 with ``Retry-After``; nothing of Ray's escapes as a 500.

A request can be sent to a deployment that is being deleted: the version was scaled to 0 or unregistered, and the
ingress replica that routed it still holds the config before (Ray replaces it while it deletes the other). Ray's router
then waits for a replica that never comes. A call that has not returned after ``GONE_CHECK_S`` asks Ray's controller,
every ``GONE_CHECK_S``, whether the deployment still exists, and answers 503 "no worker" once it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any

from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError, RayServeException

from servetune._exceptions import ApiError
from servetune.api.types import InferRequest, InferResult, ModelMetadata
from servetune.ray.plan import ServedModel, deployment_name

GONE_CHECK_S = 1.0
_seen: dict[tuple[str, str], tuple[float, bool]] = {}  # (app, deployment) -> (when asked, gone); one ask a second
_handles: dict[str, Any] = {}  # a version's application -> its deployment's handle, made once (Ray asks its controller)
_models: dict[str, str] = {}  # a version's application -> the model's name


def _gone(app: str, deployment: str) -> bool:
    """Whether the deployment no longer exists (its application's status, from Ray's controller: a blocking call)."""
    key = (app, deployment)
    now = time.monotonic()
    asked = _seen.get(key)
    if asked is not None and now - asked[0] < GONE_CHECK_S:
        return asked[1]
    status = serve.status().applications.get(app)
    gone = status is None or deployment not in status.deployments
    _seen[key] = (now, gone)
    return gone


def version_handle(model: str, version: str) -> Any:
    """The handle of a model version's deployment (in the version's own application, named as the deployment)."""
    app = deployment_name(model, version)
    handle = _handles.get(app)
    if handle is None:
        handle = _handles[app] = serve.get_deployment_handle(app, app_name=app)
        _models[app] = model
    return handle


def keep_deployed(models: Iterable[ServedModel]) -> None:
    """Forget the handles of versions no longer deployed (told on every change of what is served): a version deployed
    again is a new deployment to Ray, reached through a new handle."""
    deployed = {deployment_name(model.name, version) for model in models for version in model.deployed}
    for app in [app for app in _handles if app not in deployed]:
        del _handles[app]


def unavailable(exc: BaseException, doing: str) -> ApiError:
    """The API's answer to a Ray failure while ``doing`` something through a handle."""
    if isinstance(exc, BackPressureError):  # the deployment's max_queued_requests: the native server's full queue
        return ApiError.unavailable(f"The model's queue is full; retry later (Ray Serve: {exc})")
    return ApiError.unavailable(f"Worker died while {doing}: {exc}")


@contextlib.contextmanager
def _answered(doing: str) -> Iterator[None]:
    try:
        yield
    except (RayError, RayServeException) as exc:
        raise unavailable(exc, doing) from None


async def infer(handle: Any, request: InferRequest) -> InferResult:
    """Run ``request`` on the handle's replicas (``ModelReplica.infer_remote``; a streaming request, one with
    ``on_partial``, through ``stream_remote``). What only lives in this process (the disconnect check, the partial
    answers' callback) stays here."""
    sent = dataclasses.replace(request, is_disconnected=None, on_partial=None)
    with _answered("running this request"):
        if request.on_partial is None:
            return await _unless_gone(handle, _call(handle, sent))
        return await _unless_gone(handle, _stream(handle, sent, request.on_partial))


async def _call(handle: Any, request: InferRequest) -> InferResult:
    result: InferResult = await handle.infer_remote.remote(request)
    return result


async def _unless_gone(handle: Any, call: Coroutine[Any, Any, InferResult]) -> InferResult:
    """``call``'s result, or 503 "no worker" (``call`` cancelled) once the handle's deployment no longer exists."""
    task = asyncio.ensure_future(call)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=GONE_CHECK_S)
            if done:
                return task.result()
            if await asyncio.to_thread(_gone, handle.app_name, handle.deployment_name):
                _handles.pop(handle.app_name, None)  # the version may come back: a new handle then
                raise ApiError.no_worker(_models.get(handle.app_name, handle.app_name))
    finally:
        task.cancel()  # a no-op once done; else Ray's cancellation of the request it still routes


async def metadata(handle: Any) -> ModelMetadata:
    """The version's OIP metadata, as its replica reads it (``ModelReplica.metadata_remote``)."""
    with _answered("reading the model's metadata"):
        found: ModelMetadata = await handle.metadata_remote.remote()
    return found


async def _stream(handle: Any, request: InferRequest, on_partial: Callable[[InferResult], None]) -> InferResult:
    """Intermediate answers to ``on_partial`` as they come, the final one returned."""
    final: InferResult | None = None
    async for is_final, result in handle.options(stream=True).stream_remote.remote(request):
        if is_final:
            final = result
        else:
            on_partial(result)
    if final is None:
        raise ApiError.unavailable("The replica ended the stream without a final answer")
    return final


__all__ = ["infer", "keep_deployed", "metadata", "unavailable", "version_handle"]
