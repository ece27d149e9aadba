"""The ``context`` a handler receives, as TorchServe's ``ts.context`` defines it.

One ``Context`` lives for the life of a loaded model; the worker refreshes ``request_ids`` and
``request_processor`` before every call to ``handle``. Per-request response status, content type and
headers set here are what the worker answers with.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from servetune.handlers.control import DEFAULT, Control
from servetune.handlers.metrics import MetricsCache
from servetune.tensor_limits import DEFAULT_LIMITS, TensorLimits

__all__ = ["Context", "RequestProcessor"]


class RequestProcessor:
    """Request headers in, response status and headers out, for one request of the batch; ``control`` is what the
    server decided about the request (``servetune.handlers.control``), read by the envelopes, never by a header."""

    def __init__(self, request_header: dict[str, Any], control: Control = DEFAULT) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = request_header
        self.control = control

    def get_request_property(self, key: str) -> Any:
        """The header ``key``; exact name first, then ignoring case (HTTP names are case-insensitive)."""
        if key in self._request_header:
            return self._request_header[key]
        lowered = key.lower()
        for name, value in self._request_header.items():
            if name.lower() == lowered:
                return value
        return None

    def get_request_properties(self) -> dict[str, Any]:
        return self._request_header

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)


class Context:
    """Model information fixed at load time plus the per-batch request bookkeeping."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any],
        batch_size: int,
        gpu: int | None,
        mms_version: str,
        limit_max_image_pixels: bool = True,
        metrics: MetricsCache | None = None,
        model_yaml_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": "MMS",
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] | None = None
        self.metrics = metrics if metrics is not None else MetricsCache(model_name)
        self.model_yaml_config: dict[str, Any] = model_yaml_config if model_yaml_config is not None else {}
        self.stopping_criteria: Any = None
        self.cl_socket: Any = None
        # servetune's worker sets this: (request id, status, body, content type) of one intermediate answer
        self.partial_sink: Callable[[str, int, bytes, str | None], None] | None = None
        # servetune's: what one tensor of an OIP request may claim (the server's max_tensor_* keys)
        self.tensor_limits: TensorLimits = DEFAULT_LIMITS
        # servetune's: set by BaseHandler.initialize, which applies model-config.yaml's ``optimization`` (or fails)
        self.applies_optimization = False
        self.header_key_sequence_id = os.getenv("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id")
        self.header_key_sequence_start = os.getenv("TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start")
        self.header_key_sequence_end = os.getenv("TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end")

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    @property
    def request_processor(self) -> list[RequestProcessor] | None:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, request_processor: list[RequestProcessor] | None) -> None:
        self._request_processor = request_processor

    def _processor(self, idx: int) -> RequestProcessor:
        if self._request_processor is None:
            raise RuntimeError("no request is being handled: the context has no request headers yet")
        return self._request_processor[idx]

    def get_request_id(self, idx: int = 0) -> str | None:
        if self.request_ids is None:
            return None
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Any:
        return self._processor(idx).get_request_property(key)

    def get_request_control(self, idx: int) -> Control:
        """What the server decided about request ``idx`` (protocol, explain, describe): servetune's, typed."""
        return self._processor(idx).control

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self._processor(idx).get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self._processor(idx)
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        """Set the HTTP status (and reason phrase) of request ``idx`` of the batch."""
        if self._request_processor is not None and self._request_processor[idx] is not None:
            self._request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self._request_processor or []:
            processor.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._processor(idx).get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._processor(idx).add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> Any:
        return self._processor(idx).get_request_property(self.header_key_sequence_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and self.__dict__ == other.__dict__
