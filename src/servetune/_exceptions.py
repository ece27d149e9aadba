"""The exception tree: every error servetune raises on purpose.

ServetuneError
 ├── ConfigError          a setting, study or CLI value is invalid (names the key and the value)
 ├── ArchiveError         a model archive is unreadable, unsafe or malformed
 ├── HandlerError         a handler cannot be loaded or broke its contract
 │    ├── UnsupportedOutputError  (servetune.handlers.codec) it returned a value with no wire form; also a TypeError
 │    └── EnvelopeMismatch        (servetune.handlers.envelopes) its answers cannot be shared out among the batch
 ├── ApiError             a request to an API failed: ``status``, ``type`` (TorchServe's exception name), ``message``,
 │                        ``headers``; one constructor per kind owns the type strings; ``body`` is the JSON answer
 ├── TensorError          (servetune.tensor_limits) an OIP tensor, or the request or answer holding it, is invalid
 │    │                   (answered 400); also a ValueError, as the codec's callers and handlers catch it
 │    └── TensorLimitError     over one of the server's ``max_tensor_*`` limits (answered 413)
 ├── WorkerError          a worker process failed the frontend
 │    ├── WorkerLoadError      it could not load its model (the message is the handler's own)
 │    ├── WorkerDied           it exited, or its connection broke, while it was needed
 │    ├── WorkerTimeout        it did not answer in time
 │    ├── ParentUnavailable    a model's parent process cannot fork its workers (gone, or a fork would be unsound:
 │    │                        ``hazard``); the worker is spawned instead
 │    └── ProtocolError        (servetune.server.messages) a peer sent something that is not a frame or a message
 ├── QueueFull            (servetune.server.batcher) a model's job queue is at capacity (internal: the model answers
 │                        ``ApiError.queue_full``)
 ├── BenchError           a load run could not be carried out
 ├── ManagementError      (servetune.tune) a management API refused a call; ``status`` is its HTTP status
 └── OptimizeError        a model variant could not be made or used
      ├── VariantNotApplicable   (servetune.optimize) the variant cannot apply; ``reason`` says why
      └── ParityError            (servetune.optimize) its answers differ from eager; ``report`` has the figures

Classes marked with a module live there, next to the code that raises them, and derive from this tree.

Outside the tree, on purpose:

- ``PredictionException`` and its ``BadInputError`` (``servetune.handlers.util``, aliased as ``ts.utils.util``) are
  the handler contract's: handler code raises them (TorchServe's handlers import ``PredictionException`` from
  ``ts.utils.util`` and construct it with TorchServe's signature); the worker answers them with their
  ``error_code``. They are the handler's errors, not servetune's.
- ``_Refused`` (``servetune.api.http_limits``, ``servetune.config.model_yaml``) are private signals that never leave
  their module: each is turned into that module's answer (a 4xx, a ConfigError) where it is caught.
"""

from __future__ import annotations

import json

RETRY_AFTER_S = "1"
NOT_FOUND_MESSAGE = "Requested resource is not found, please refer to API document."
METHOD_NOT_ALLOWED_MESSAGE = "Requested method is not allowed, please refer to API document."
AUTH_FAILED_MESSAGE = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"


def error_body(status: int, type_: str, message: str) -> bytes:
    """TorchServe's error JSON, ``{"code": N, "type": "...", "message": "..."}``, pretty-printed as Gson does."""
    return json.dumps({"code": status, "type": type_, "message": message}, indent=2).encode()


class ServetuneError(Exception):
    """Base class of every error servetune raises on purpose."""


class ConfigError(ServetuneError):
    """A configuration value is invalid."""


class ArchiveError(ServetuneError):
    """A model archive is unreadable, unsafe or malformed."""


class HandlerError(ServetuneError):
    """A handler cannot be loaded or broke the handler contract."""


class ApiError(ServetuneError):
    """An API request failed; answered as TorchServe answers it (``status``, ``type``, ``message``).

    Build one with the constructor of its kind (``ApiError.model_not_found(name)``), so that the status and the
    exception name TorchServe clients match on are written in one place.
    """

    def __init__(
        self, message: str, status: int = 400, type: str = "BadRequestException", headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.headers = dict(headers or {})

    @property
    def body(self) -> bytes:
        return error_body(self.status, self.type, self.message)

    # ---- 400 ---------------------------------------------------------------------------------

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(message, 400, "BadRequestException")

    @classmethod
    def invalid_key(cls) -> ApiError:
        """A missing, wrong or expired bearer token (TorchServe answers 400, not 401)."""
        return cls(AUTH_FAILED_MESSAGE, 400, "InvalidKeyException", {"WWW-Authenticate": "Bearer"})

    @classmethod
    def bad_archive(cls, message: str) -> ApiError:
        return cls(message, 400, "ModelException")

    @classmethod
    def download_failed(cls, message: str) -> ApiError:
        return cls(message, 400, "DownloadArchiveException")

    # ---- 403 / 404 / 405 / 409 ---------------------------------------------------------------

    @classmethod
    def invalid_version(cls, message: str) -> ApiError:
        return cls(message, 403, "InvalidModelVersionException")

    @classmethod
    def not_found(cls) -> ApiError:
        """A path no API serves."""
        return cls(NOT_FOUND_MESSAGE, 404, "ResourceNotFoundException")

    @classmethod
    def model_not_found(cls, name: str, message: str | None = None) -> ApiError:
        return cls(message or f"Model not found: {name}", 404, "ModelNotFoundException")

    @classmethod
    def version_not_found(cls, name: str, version: str) -> ApiError:
        message = f"Model version: {version} does not exist for model: {name}"
        return cls(message, 404, "ModelVersionNotFoundException")

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        return cls(METHOD_NOT_ALLOWED_MESSAGE, 405, "MethodNotAllowedException")

    @classmethod
    def conflict(cls, message: str) -> ApiError:
        return cls(message, 409, "ConflictStatusException")

    # ---- 413 / 5xx ---------------------------------------------------------------------------

    @classmethod
    def too_large(cls, limit: int) -> ApiError:
        message = f"Request body is larger than max_request_size ({limit} bytes)"
        return cls(message, 413, "RequestEntityTooLargeException")

    @classmethod
    def internal(cls, message: str) -> ApiError:
        return cls(message, 500, "InternalServerException")

    @classmethod
    def not_implemented(cls, message: str) -> ApiError:
        return cls(message, 501, "NotImplementedException")

    @classmethod
    def unavailable(cls, message: str) -> ApiError:
        """503 with ``Retry-After``: no worker, a full queue, a worker that died mid-request, shutting down."""
        return cls(message, 503, "ServiceUnavailableException", {"Retry-After": RETRY_AFTER_S})

    @classmethod
    def no_worker(cls, name: str) -> ApiError:
        return cls.unavailable(
            f'Model "{name}" has no worker to serve inference request. Please use scale workers API to add workers.'
        )

    @classmethod
    def queue_full(cls, name: str, capacity: int) -> ApiError:
        return cls.unavailable(f'Model "{name}" has a full job queue ({capacity} requests waiting); retry later')

    @classmethod
    def timeout(cls, message: str) -> ApiError:
        return cls(message, 504, "RequestTimeoutException")

    @classmethod
    def response_too_large(cls, size: int, limit: int) -> ApiError:
        message = f"Response of {size} bytes is larger than max_response_size ({limit})"
        return cls(message, 507, "InternalServerException")


class WorkerError(ServetuneError):
    """A worker process failed the frontend."""


class WorkerLoadError(WorkerError):
    """The worker could not load its model; the message is the handler's own."""


class WorkerDied(WorkerError):
    """The worker process exited (or its connection broke) while the frontend needed it."""


class WorkerTimeout(WorkerError):
    """The worker did not answer within the allowed time."""


class ParentUnavailable(WorkerError):
    """A model's parent process cannot fork a worker: it died, or (``hazard``) forking it would not be sound."""

    def __init__(self, message: str, *, hazard: bool = False) -> None:
        super().__init__(message)
        self.hazard = hazard


class BenchError(ServetuneError):
    """A load run could not be carried out."""


class ManagementError(ServetuneError):
    """A management API refused a call; ``status`` is its HTTP status (0 when it could not be reached)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class OptimizeError(ServetuneError):
    """A model variant could not be made or used."""
