"""The one place servetune calls a Ray Serve deployment handle (the driver, the frontend and a replica reach a model
version's replicas this way when Ray's proxy did not route the request there itself), and the one rule for what a
failure on the way means: the replica died mid-request, its deployment is gone or its queue is full. Each is
answered as the native server answers it, 503 with ``Retry-After``; nothing of Ray's escapes as a 500.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError, RayServeException

from servetune._exceptions import ApiError
from servetune.api.types import InferRequest, InferResult, ModelMetadata
from servetune.ray.plan import deployment_name


def version_handle(model: str, version: str) -> Any:
    """The handle of a model version's deployment (in the model's application)."""
    return serve.get_deployment_handle(deployment_name(model, version), app_name=model)


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
            result: InferResult = await handle.infer_remote.remote(sent)
            return result
        return await _stream(handle, sent, request.on_partial)


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


__all__ = ["infer", "metadata", "unavailable", "version_handle"]
