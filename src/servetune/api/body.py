"""A prediction request's body: read within ``max_request_size``, then split into inputs as TorchServe splits them."""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import Message

from servetune._exceptions import ApiError
from servetune.api.types import Input

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; ApiError 413 as soon as it (or its declared length) passes ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError.too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError.too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def parse_inputs(request: Request, body: bytes) -> list[Input]:
    """TorchServe's rule: form fields become one input each; any other body is the input ``body``."""
    ctype = request.headers.get("content-type")
    base = (ctype or "").split(";")[0].strip().lower()
    if base not in FORM_TYPES:
        return [Input("body", ctype, body)]

    async def replay() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    form_request = Request(request.scope, replay)
    try:
        form = await form_request.form(max_files=1000, max_fields=1000)
    except Exception as exc:  # python-multipart raises several types for a malformed body
        raise ApiError.bad_request(f"Malformed {base} body: {exc}") from None
    inputs: list[Input] = []
    try:
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                inputs.append(Input(name, value.content_type, await value.read()))
            else:
                inputs.append(Input(name, "text/plain", str(value).encode()))
    finally:
        await form.close()
    if not inputs:
        raise ApiError.bad_request(f"Empty {base} body: no fields")
    return inputs


__all__ = ["parse_inputs", "read_body"]
