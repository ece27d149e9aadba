"""The whole contract between the API layer and a backend, in one small module.

Every wire protocol (TorchServe's inference, management and metrics APIs today) is written once in ``servetune.api``
against :class:`Backend`; the native server (``servetune.server``) and Ray Serve (``servetune.ray``) implement it.
A request: the protocol parses it into an :class:`InferRequest` and calls ``Backend.infer``; the backend batches it
and answers an :class:`InferResult`, or raises ``ApiError`` (unknown model, no worker, full queue, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from servetune.handlers.control import DEFAULT, Control
from servetune.handlers.service import InputParam

if TYPE_CHECKING:  # annotations only: a worker process imports this module (messages) and needs no numpy
    import asyncio

    from servetune.api.metrics import ApiMetrics
    from servetune.api.plan import RegisterParams, VersionPlan
    from servetune.tensors import TensorMetadata


# One input of a request: ``name`` is ``"body"`` for a raw body, else the form field's name. The handler contract's
# own type, so that a request reaches the handler as it was parsed.
Input = InputParam


@dataclass(slots=True)
class InferRequest:
    """One inference request, as every protocol hands it to a backend: one item of the model's dynamic batch."""

    request_id: str
    headers: dict[str, str]  # the client's (a handler sees them less the reserved names: ``handlers.control``)
    inputs: list[Input]
    arrival: float  # time.monotonic() when the server accepted it (the batcher's delay counts from here)
    is_disconnected: Callable[[], bool] | None = None  # the client went away: drop it rather than run it
    # What the server decided from the route: protocol, explain, describe (``?customized=true``: a batch of its own).
    # Never read from headers; requests of different control never share a handler call.
    control: Control = DEFAULT
    # A streaming request (gRPC StreamPredictions): it runs in a batch of its own, and every intermediate answer the
    # handler sends (``send_intermediate_predict_response``) reaches this callback, on the event loop, before
    # ``Backend.infer`` returns the final answer. None: intermediate answers are dropped.
    on_partial: Callable[[InferResult], None] | None = None
    # time.monotonic() after which the client no longer waits (gRPC's deadline; None: none): the native batcher drops
    # the request rather than run it. Meaningful in this process only (a monotonic clock is per host).
    deadline: float | None = None
    # One of the done callbacks of the request's future (added there too), that the native backend runs the moment it
    # sets the result rather than a turn of the loop later (a direct route writes its answer from it). Any other way
    # the future ends (an error, a cancel) runs it as the done callback it is. Frontend only, like the future.
    on_answer: Callable[[asyncio.Future[InferResult]], None] | None = None

    @property
    def solo(self) -> bool:
        """Runs in a batch of its own: TorchServe's describe call, or a stream (TorchServe forces batch size one for
        StreamPredictions)."""
        return self.control.describe or self.on_partial is not None


@dataclass(slots=True)
class InferResult:
    """The handler's answer to one request, with where its time went."""

    status: int
    body: bytes
    content_type: str | None
    headers: dict[str, str] = field(default_factory=dict)
    queue_ms: float = 0.0  # accepted -> its batch sent to a worker
    handler_ms: float = 0.0  # the handler's time on the whole batch
    batch_size: int = 0  # requests in the batch it ran in
    worker_id: str = ""
    version: str = ""  # the model version that served it (metrics are labelled with it)


@dataclass(frozen=True)
class ModelRef:
    """A registered model version."""

    name: str
    version: str
    url: str  # as registered: what the management API reports as ``modelUrl``
    is_default: bool


@dataclass(frozen=True)
class WorkerStatus:
    """One worker process (native) or replica (Ray), as describe reports it."""

    id: str
    status: str  # READY, STARTING, RESTARTING, CRASHED, UNLOADING
    start_time: float = 0.0  # epoch seconds
    pid: int = -1
    memory_bytes: int = 0  # resident (RSS)
    gpu_id: int | None = None
    gpu_memory_bytes: int = 0
    restarts: int = 0
    pss_bytes: int | None = None  # proportional set size: shared pages split among their processes (None: unknown)
    last_error: str = ""
    # as the worker process itself reports them (None: not known yet)
    num_threads: int | None = None
    inter_op_threads: int | None = None
    cpu_cores: tuple[int, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific fields (Ray: ``node``)


@dataclass(frozen=True)
class ModelStatus:
    """Everything describe reports about a model version; ``servetune.api.describe`` turns it into TorchServe's JSON."""

    plan: VersionPlan
    is_default: bool
    min_workers: int
    max_workers: int
    batch_size: int
    max_batch_delay_ms: int
    healthy: bool
    workers: list[WorkerStatus]
    device_type: str
    crash_loop: bool = False
    queue_capacity: int | None = None  # None: the backend does not expose its queue
    queue_pending: int | None = None
    num_threads: int = 0  # configured intra-op threads per worker (0: automatic share)
    inter_op_threads: int = 0
    cpu_pinning: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific fields (Ray: ``backend``, ``deployment``)


@dataclass(frozen=True)
class Reconfigure:
    """servetune's in-place changes of a registered version (``PUT /models/{name}?batch_size=...``); None: unchanged."""

    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    num_threads: int | None = None
    inter_op_threads: int | None = None  # needs new workers: the backend restarts them
    cpu_pinning: bool | None = None
    for_workers: int | None = None  # the workers the change is for, when the same call scales (checked against them)

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__dataclass_fields__ if name != "for_workers")


@dataclass(frozen=True)
class ModelMetadata:
    """A model version as the Open Inference Protocol describes it (``GET /v2/models/{name}``, gRPC ModelMetadata):
    the tensors declared in its model-config.yaml (``oip:``) or by its handler (``model_metadata()``), else none."""

    name: str
    versions: tuple[str, ...]  # every registered version of the model
    platform: str  # "<project>_<format>", informational; "" when not declared
    inputs: tuple[TensorMetadata, ...] = ()
    outputs: tuple[TensorMetadata, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": list(self.versions),
            "platform": self.platform,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }


@dataclass
class Readiness:
    """Whether the server has finished loading its start-up models, and which of them failed to load.

    ``/ping`` is Healthy only once ``starting`` is over, no start-up model failed, and the backend is healthy; while
    starting, a prediction for a model not registered yet gets 503 (it may be a start-up model still loading), not
    404: once ``/ping`` has said Healthy, no prediction for a start-up model gets 404.
    """

    starting: bool = False
    failed: dict[str, str] = field(default_factory=dict)


class InferenceBackend(Protocol):
    """What an inference-side protocol needs: serve a request, say what is registered, say whether it is ready."""

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResult:
        """Run one request through the model's batcher; raises ``ApiError`` (404 unknown, 503 no worker/full)."""
        ...

    def models(self) -> list[ModelRef]:
        """Every registered version, sorted by name then version."""
        ...

    async def healthy(self) -> bool:
        """TorchServe's ``/ping`` rule: every model's default version has at least ``minWorkers`` ready workers."""
        ...

    async def ready(self, name: str, version: str | None) -> bool:
        """This version (default: the default one) has at least its ``minWorkers`` ready; raises ApiError 404."""
        ...

    async def metadata(self, name: str, version: str | None) -> ModelMetadata:
        """This version's OIP metadata (``servetune.api.metadata.model_metadata``); raises ApiError 404."""
        ...


class Backend(InferenceBackend, Protocol):
    """A whole model server behind TorchServe's APIs. Register and scale follow TorchServe's steps: ``plan`` the
    version from its archive, ``add`` it (0 workers), ``scale`` it; a failed synchronous start is undone with
    ``remove``. The API layer owns the parameters, the messages and the status codes."""

    name: str  # "native", "ray"
    metrics: ApiMetrics | None

    @property
    def inference_url(self) -> str | None:
        """Where the backend serves inference itself (Ray's proxy); None: the API layer binds the inference API."""
        ...

    def open(self) -> None:
        """Connect (before the event loop runs: Ray installs signal handlers on the main thread)."""
        ...

    async def started(self, failed: dict[str, str]) -> None:
        """The start-up models are loaded (``failed``: those that did not load, and why)."""
        ...

    async def close(self, grace_s: float) -> None:
        """Finish in-flight work within ``grace_s``, stop every worker, disconnect."""
        ...

    async def plan(self, archive_path: str, params: RegisterParams) -> VersionPlan:
        """Read the archive at ``archive_path`` and plan the version (``servetune.api.plan.plan_version``)."""
        ...

    async def add(self, plan: VersionPlan) -> None:
        """Register the version (409 if it exists); a new model takes it as its default. It serves once ``scale``
        has run; a backend may start deploying the planned workers at once (Ray does: one deploy, not two)."""
        ...

    async def scale(self, name: str, version: str | None, min_workers: int, max_workers: int, wait_s: float) -> bool:
        """Set the version's workers; wait up to ``wait_s`` (0: do not wait) for them. True when done, False when
        still in progress; raises ``WorkerError`` when a new worker cannot start."""
        ...

    async def remove(self, name: str, version: str | None, grace_s: float) -> None:
        """Unregister a version (the API layer has checked the default-version rule)."""
        ...

    async def set_default(self, name: str, version: str) -> None: ...

    async def reconfigure(self, name: str, version: str | None, change: Reconfigure) -> None:
        """Apply in-place changes (batching, threads, pinning) from the next batch on."""
        ...

    async def status(self, name: str, version: str | None) -> ModelStatus:
        """Describe one version (raises ApiError 404)."""
        ...


__all__ = [
    "Backend",
    "InferRequest",
    "InferResult",
    "InferenceBackend",
    "Input",
    "ModelMetadata",
    "ModelRef",
    "ModelStatus",
    "Readiness",
    "Reconfigure",
    "WorkerStatus",
]
