"""What every gRPC service of the API shares: the server's parts, token checks, and a call turned into the
:class:`InferRequest` a backend runs (as the REST API builds it from an HTTP request)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from servetune._exceptions import ApiError
from servetune.api.answers import observe, while_starting
from servetune.api.auth import TokenStore
from servetune.api.grpc.status import refuse_token
from servetune.api.management import Management
from servetune.api.metrics import ApiMetrics
from servetune.api.oip import ensure_ready
from servetune.api.types import Backend, InferRequest, InferResult, Input, Readiness
from servetune.config.server import ServerConfig
from servetune.protos import BATCH_SIZE, HANDLER_MS, QUEUE_MS

# Metadata a handler never sees as a request header: the key, and gRPC's own transport fields.
HIDDEN_METADATA = frozenset({"authorization", "user-agent", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout"})


@dataclass
class Served:
    """The server's parts the gRPC services answer from (one object, shared by every service)."""

    backend: Backend
    config: ServerConfig
    management: Management
    readiness: Readiness = field(default_factory=Readiness)
    tokens: TokenStore | None = None

    @property
    def metrics(self) -> ApiMetrics | None:
        return self.backend.metrics

    async def authorize(self, context: grpc.aio.ServicerContext, kind: str) -> None:
        """The REST rules: the management key on management RPCs (when token auth is on), the inference key on
        inference RPCs only with ``inference_token_authorization=true``; ``ping`` follows ``open_ping``."""
        if self.tokens is None:
            return
        if kind == "ping":
            if self.config.open_ping or not self.config.inference_token_authorization:
                return
            kind = "inference"
        elif kind == "inference" and not self.config.inference_token_authorization:
            return
        if not self.tokens.check(kind, metadata(context).get("authorization")):
            await refuse_token(context)

    async def healthy(self) -> bool:
        """``/ping``'s rule: start-up models loaded, none failed, and the backend healthy."""
        readiness = self.readiness
        return not readiness.starting and not readiness.failed and await self.backend.healthy()

    async def infer(
        self, name: str, version: str | None, job: InferRequest, *, require_ready: bool = False
    ) -> InferResult:
        """One job through the backend, observed; a model not loaded yet while the server starts is 503.
        ``require_ready``: KServe's rule, a model that is not ready is refused at once (503)."""
        start = time.perf_counter()
        try:
            if require_ready:
                await ensure_ready(self.backend, name, version)
            result = await self.backend.infer(name, version, job)
        except ApiError as exc:
            exc = while_starting(exc, name, self.readiness)
            self.observe(name, version, None, exc.status, start)
            raise exc from None
        self.observe(name, version, result, result.status, start)
        return result

    def observe(self, name: str, version: str | None, result: InferResult | None, status: int, start: float) -> None:
        metrics = self.metrics
        if metrics is None or not metrics.observing:  # the Ray driver: its replicas report what they run
            return
        if result is None:
            metrics.observe_status(status)
            return
        observe(metrics, name, version, result, start)


def metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata (binary ``-bin`` entries left out), keys lower-case."""
    return {str(k).lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def infer_request(
    context: grpc.aio.ServicerContext,
    inputs: list[Input],
    *,
    request_id: str | None = None,
    on_partial: Callable[[InferResult], None] | None = None,
) -> InferRequest:
    """One call as one item of the model's batch: its inputs, and its metadata as the handler's headers."""
    meta = metadata(context)
    headers = {k: v for k, v in meta.items() if k not in HIDDEN_METADATA}  # ``explain`` etc.: the worker's to set
    rid = request_id or meta.get("x-request-id") or str(uuid.uuid4())
    return InferRequest(rid, headers, inputs, time.monotonic(), _cancelled(context), on_partial=on_partial)


def send_timing(context: grpc.aio.ServicerContext, result: InferResult) -> None:
    """Where the answer's time went, as trailing metadata (the REST API's ``X-Servetune-*`` headers)."""
    context.set_trailing_metadata(
        (
            (QUEUE_MS, f"{result.queue_ms:.3f}"),
            (HANDLER_MS, f"{result.handler_ms:.3f}"),
            (BATCH_SIZE, str(result.batch_size)),
        )
    )


def _cancelled(context: Any) -> Callable[[], bool]:
    return lambda: bool(context.cancelled())


def version_or_none(version: str) -> str | None:
    """Protobuf's empty string is "not given": the default version."""
    return version or None


__all__ = ["HIDDEN_METADATA", "Served", "infer_request", "metadata", "send_timing", "version_or_none"]
