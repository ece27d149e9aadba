"""How request inputs become handler data and handler outputs become response bodies (TorchServe's rules).

Inputs: ``application/json`` -> ``json.loads``; ``text/*`` -> ``str`` (undecodable UTF-8 is passed on as
bytes, as TorchServe does); anything else -> ``bytearray``. Outputs: bytes as-is, ``str`` as UTF-8, a
``torch.Tensor`` via ``torch.save``, anything else ``json.dumps(indent=2)``.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

from servetune._exceptions import HandlerError, error_body
from servetune.handlers.util import BadInputError
from servetune.tensor_limits import strict_json

__all__ = ["decode_value", "encode_value", "error_body", "json_value", "mime_type"]

JSON_CONTENT_TYPE = "application/json"


def mime_type(content_type: str | None) -> str:
    """``"Application/JSON; charset=utf-8"`` -> ``"application/json"``, like the frontend's ``getMimeType``."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def json_value(name: str, data: bytes | bytearray, *, strict: bool = False) -> Any:
    """``data`` as JSON; BadInputError naming the input otherwise. ``strict``: without Python's extensions (``NaN``
    and the infinities are refused), as KServe reads a request."""
    try:
        return strict_json(data) if strict else json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadInputError(f"{name} is not valid JSON ({exc})") from None


def decode_value(name: str, content_type: str | None, data: bytes, *, decode: bool = True, strict: bool = False) -> Any:
    """The value a handler sees for one input; raises ``BadInputError`` for a body that is not valid JSON
    (``strict``: see :func:`json_value`)."""
    mime = mime_type(content_type)
    if decode and mime == JSON_CONTENT_TYPE:
        return json_value(name, data, strict=strict)
    if decode and mime.startswith("text"):
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return bytearray(data)
    return bytearray(data)


class UnsupportedOutputError(HandlerError, TypeError):
    """A handler returned a value that has no wire form."""


def encode_value(value: Any) -> tuple[bytes, str | None]:
    """The body for one handler output and the content type it implies (None: no implied type)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), None
    if isinstance(value, str):
        return value.encode("utf-8"), None
    torch = sys.modules.get("torch")  # a tensor can only exist if torch is already imported
    if torch is not None and isinstance(value, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue(), None
    try:
        return json.dumps(value, indent=2).encode("utf-8"), JSON_CONTENT_TYPE
    except (TypeError, ValueError) as exc:
        raise UnsupportedOutputError(f"cannot serialize a {type(value).__name__}: {exc}") from exc
