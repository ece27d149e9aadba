"""The gateway: what every request gets, whatever its protocol and transport.

Five protocols reach a model: TorchServe's REST routes (``api/inference.py``), KServe v1 (``api/kserve.py``), the
Open Inference Protocol v2 over REST (``api/oip_rest.py``) and gRPC (``api/grpc/oip.py``), and TorchServe's gRPC
(``api/grpc/torchserve.py``). Each protocol module only parses its wire format into one :class:`Call` and renders the
:class:`Answer` (or the ``ApiError``) that comes back; two transport adapters carry what the wire says about the
caller into a :class:`Caller` (``api/rest.py`` for HTTP, ``api/grpc/calls.py`` for gRPC). Everything else is decided
here, once:

- **who may call** (:meth:`Gateway.authorize`): every route and RPC declares its :data:`Access`; the management key
  on management calls whenever token authorization is on; the inference key on predictions only with
  ``inference_token_authorization=true``; probes (health, readiness, listings, metadata) follow ``/ping``: open with
  ``open_ping=true``, else as predictions (TorchServe's scheme, the keys in ``api/auth.py``);
- **readiness**: the server is ready once its start-up models are loaded, none failed, and the backend is healthy
  (:meth:`Gateway.server_ready`: ``/ping``, ``/v2/health/ready``, gRPC Ping, ServerReady, Health); a model that is not
  registered while the start-up models load may be one of them (:meth:`Gateway._still_loading`): a prediction or a
  metadata call for it is 503, not 404, and its ready probe says not ready; a KServe prediction for a model that is
  not ready is refused at once (:attr:`Call.refuse_not_ready`), as KServe's model server refuses it;
- **the request id**: the client's ``x-request-id`` (a header, or gRPC metadata), else a fresh one;
- **limits**: a request's size is bounded where its bytes arrive (``max_request_size``: the REST adapter reads the
  body within it, gRPC's own receive limit), an answer's here (``max_response_size``: 507);
- **deadline**: the caller's deadline (gRPC's; REST's ``x-servetune-timeout-ms``; OIP's ``timeout`` parameter, the
  sooner) travels as the request's typed ``deadline``: the batcher drops a request whose client stopped waiting
  rather than run it, and a model's online controller refuses at once one it predicts cannot make it;
- **metrics**: a prediction the backend answered is observed once (latency, queue and handler time); every answer to
  a prediction is counted in its status class (:meth:`Gateway.count`, which both transports call with the status
  they send); a process whose metrics only sum others' reports (the Ray driver) observes nothing;
- **timing**: an answer carries its queue time, handler time and batch size (:meth:`Answer.timing`), named once in
  ``servetune.timing``; REST sends them as headers, gRPC as trailing metadata.

Adding a protocol: a module that parses into :class:`Call` and renders :class:`Answer`, and its registration
(``api/protocols.py`` for HTTP routes, ``api/grpc/server.py`` for a gRPC service).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from servetune._exceptions import ApiError
from servetune.api.types import InferenceBackend, InferRequest, InferResult, Input, ModelMetadata, Readiness
from servetune.config.server import ServerConfig
from servetune.handlers.control import Control
from servetune.timing import BATCH_SIZE, HANDLER_MS, QUEUE_MS

if TYPE_CHECKING:  # the metrics app serves over HTTP (api/rest.py), which imports this module
    from servetune.api.auth import TokenStore
    from servetune.api.metrics import ApiMetrics

# A backend's synchronous way in (the native backend's ``submit``): the request queued, its answer a future.
Submit = Callable[[str, "str | None", InferRequest], "asyncio.Future[InferResult]"]

# Who may call a route or an RPC (see the module): never checked, a probe, a prediction, a management call, and the
# token API (``GET /token``, the ``API`` key).
Access = Literal["open", "probe", "inference", "management", "API"]
OPEN: Access = "open"
PROBE: Access = "probe"
INFERENCE: Access = "inference"
MANAGEMENT: Access = "management"
TOKEN_API: Access = "API"


@dataclass(frozen=True, slots=True)
class Caller:
    """What a transport knows of whoever sent a request, before its body is read."""

    received: float  # time.perf_counter() when the transport accepted it (the latency metric counts from here)
    authorization: str | None = None  # the ``Authorization`` header (gRPC: metadata)
    request_id: str | None = None  # ``x-request-id``, when the client sent one
    is_disconnected: Callable[[], bool] | None = None  # the client has gone: drop the request rather than run it
    deadline: float | None = None  # time.monotonic() after which the client no longer waits; None: no deadline


@dataclass(slots=True)
class Call:
    """One prediction as a protocol module parsed it from its wire format; the gateway decides the rest."""

    model: str
    version: str | None  # None: the default version
    inputs: list[Input]
    control: Control  # the protocol, explain: from the route, never from a header
    headers: dict[str, str]  # what the handler may read (the worker drops the server's reserved names)
    refuse_not_ready: bool = False  # KServe's protocols: a model that is not ready is refused at once (503)
    on_partial: Callable[[InferResult], None] | None = None  # a stream's intermediate answers (gRPC)
    deadline: float | None = None  # the request's own (OIP's ``timeout`` parameter): time.monotonic(); None: none


@dataclass(frozen=True, slots=True)
class Answer:
    """A backend's answer to a :class:`Call`, with the request id it ran under."""

    result: InferResult
    request_id: str

    def timing(self) -> tuple[tuple[str, str], ...]:
        """Where its time went: the fields REST sends as headers and gRPC as trailing metadata."""
        result = self.result
        return (
            (QUEUE_MS, f"{result.queue_ms:.3f}"),
            (HANDLER_MS, f"{result.handler_ms:.3f}"),
            (BATCH_SIZE, str(result.batch_size)),
        )


def new_request_id() -> str:
    """A random id in the UUID text form (``os.urandom`` is ~7x cheaper than ``str(uuid.uuid4())``)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Gateway:
    """The rules every protocol's requests go through (see the module), over one backend."""

    def __init__(
        self,
        backend: InferenceBackend,
        config: ServerConfig,
        *,
        tokens: TokenStore | None = None,
        readiness: Readiness | None = None,
        metrics: ApiMetrics | None = None,
    ) -> None:
        self.backend = backend
        self.config = config
        self.tokens = tokens
        self.readiness = readiness if readiness is not None else Readiness()
        # The Ray driver's metrics only sum its replicas' reports: the requests it answers are counted where they run.
        self.metrics = metrics if metrics is not None and metrics.observing else None
        # the backend's synchronous way in, where it has one (the native backend's): :meth:`submit`
        self._submit: Submit | None = getattr(backend, "submit", None)
        self._ready_now: Callable[[str, str | None], bool] | None = getattr(backend, "ready_now", None)

    # ---- who may call ----------------------------------------------------------------------------------------------

    def authorize(self, access: Access, authorization: str | None) -> None:
        """The token check of every route and RPC: raises ApiError (``InvalidKeyException``) when ``authorization``
        (``Bearer <key>``) does not hold the key ``access`` needs."""
        if self.tokens is None or access == OPEN:
            return
        if access == PROBE:
            if self.config.open_ping:
                return
            access = INFERENCE
        if access == INFERENCE and not self.config.inference_token_authorization:
            return
        if not self.tokens.check(access, authorization):
            raise ApiError.invalid_key()

    # ---- readiness -------------------------------------------------------------------------------------------------

    async def server_ready(self) -> bool:
        """``/ping``'s rule: the start-up models loaded, none failed, and the backend healthy."""
        readiness = self.readiness
        return not readiness.starting and not readiness.failed and await self.backend.healthy()

    def _still_loading(self, error: ApiError) -> bool:
        """A model not found while the server still loads its start-up models may be one of them."""
        return error.status == 404 and self.readiness.starting

    def _not_loaded_yet(self, error: ApiError, name: str) -> ApiError:
        if self._still_loading(error):
            return ApiError.unavailable(f"Model {name} is not loaded yet: the server is loading its start-up models")
        return error

    async def model_ready(self, name: str, version: str | None) -> bool:
        """The version (None: the default) has its minimum of workers ready; ApiError 404 for an unknown one (not
        ready, while the start-up models load)."""
        try:
            return await self.backend.ready(name, version)
        except ApiError as exc:
            if self._still_loading(exc):
                return False
            raise

    # ---- what a request gets ---------------------------------------------------------------------------------------

    async def infer(self, call: Call, caller: Caller) -> Answer:
        """Run one prediction through the backend, observed; raises ApiError (the backend's, 503 for a model not
        ready under KServe's rule or not loaded yet, 507 for an answer over ``max_response_size``)."""
        job = self._job(call, caller)
        try:
            if call.refuse_not_ready and not await self.backend.ready(call.model, call.version):
                raise ApiError.unavailable(f"Model with name {call.model} is not ready.")
            result = await self.backend.infer(call.model, call.version, job)
        except ApiError as exc:
            raise self._not_loaded_yet(exc, call.model) from None
        return self.answered(call, caller, job, result)

    @property
    def submits(self) -> bool:
        """Whether the backend has :meth:`submit`'s way in (the native backend; Ray's has ``infer`` only)."""
        return self._submit is not None

    def submit(self, call: Call, caller: Caller) -> tuple[asyncio.Future[InferResult], InferRequest] | None:
        """:meth:`infer`'s way in without a coroutine (a direct route's, ``api/rest.py``): the backend's future for
        the call and the request it queued, to be settled with :meth:`settled`; None where the backend has no such
        way (Ray's: its ``infer`` only). Raises ApiError as :meth:`infer` does."""
        submit, ready = self._submit, self._ready_now
        if submit is None or (call.refuse_not_ready and ready is None):
            return None
        job = self._job(call, caller)
        try:
            if call.refuse_not_ready and ready is not None and not ready(call.model, call.version):
                raise ApiError.unavailable(f"Model with name {call.model} is not ready.")
            return submit(call.model, call.version, job), job
        except ApiError as exc:
            raise self._not_loaded_yet(exc, call.model) from None

    def settled(self, call: Call, caller: Caller, job: InferRequest, future: asyncio.Future[InferResult]) -> Answer:
        """The answer to a :meth:`submit`'s call once its future is done (not cancelled), as :meth:`infer` returns
        it; raises ApiError as :meth:`infer` does."""
        try:
            result = future.result()
        except ApiError as exc:
            raise self._not_loaded_yet(exc, call.model) from None
        return self.answered(call, caller, job, result)

    def _job(self, call: Call, caller: Caller) -> InferRequest:
        deadline = caller.deadline
        if call.deadline is not None and (deadline is None or call.deadline < deadline):
            deadline = call.deadline
        return InferRequest(
            caller.request_id or new_request_id(),
            call.headers,
            call.inputs,
            time.monotonic(),
            caller.is_disconnected,
            call.control,
            call.on_partial,
            deadline,
        )

    def answered(self, call: Call, caller: Caller, job: InferRequest, result: InferResult) -> Answer:
        """The backend's result as the caller's answer: within ``max_response_size`` (else ApiError 507), observed."""
        self.check_answer_size(len(result.body))
        metrics = self.metrics
        if metrics is not None:
            metrics.observe_request(
                call.model,
                result.version or call.version or "",
                time.perf_counter() - caller.received,
                result.queue_ms / 1000.0,
                result.handler_ms / 1000.0 or None,
            )
        return Answer(result, job.request_id)

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        """The version's OIP metadata (ApiError 404 for an unknown one; 503 while the start-up models load)."""
        try:
            return await self.backend.metadata(name, version)
        except ApiError as exc:
            raise self._not_loaded_yet(exc, name) from None

    def model_names(self) -> list[str]:
        """Every registered model's name, sorted (KServe's model lists, the API description)."""
        return sorted({ref.name for ref in self.backend.models()})

    def check_answer_size(self, size: int) -> None:
        """An answer of ``size`` bytes within ``max_response_size``, else ApiError 507."""
        if size > self.config.max_response_size:
            raise ApiError.response_too_large(size, self.config.max_response_size)

    def count(self, access: Access, status: int) -> None:
        """Count a call's answer in TorchServe's status classes (``Requests2XX``/``4XX``/``5XX``): every answer to a
        prediction, whatever its protocol and transport (both adapters call this once per call; a refused token is
        not counted)."""
        if self.metrics is not None and access == INFERENCE:
            self.metrics.observe_status(status)


__all__ = [
    "INFERENCE",
    "MANAGEMENT",
    "OPEN",
    "PROBE",
    "TOKEN_API",
    "Access",
    "Answer",
    "Call",
    "Caller",
    "Gateway",
    "Submit",
    "new_request_id",
]
