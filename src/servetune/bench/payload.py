"""Request bodies: one file or a directory of files (cycled), raw or as one multipart form field.

Bodies are encoded once, before the run, so the load loop only hands bytes to the socket.
"""

from __future__ import annotations

import mimetypes
import secrets
from dataclasses import dataclass
from pathlib import Path

from servetune._exceptions import BenchError

_EXTRA_TYPES = {".json": "application/json", ".txt": "text/plain", ".npy": "application/octet-stream"}


@dataclass(frozen=True)
class Payload:
    """One request body ready to send; ``content_type`` is the header value (multipart carries its boundary)."""

    name: str
    body: bytes
    content_type: str | None


def guess_content_type(path: Path) -> str:
    """The content type of a file from its suffix; ``application/octet-stream`` when unknown."""
    suffix = path.suffix.lower()
    if suffix in _EXTRA_TYPES:
        return _EXTRA_TYPES[suffix]
    guessed, _ = mimetypes.guess_type(path.name)
    return guessed or "application/octet-stream"


def input_files(path: Path) -> list[Path]:
    """The files an ``--input`` names: the file itself, or a directory's visible regular files, sorted by name."""
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise BenchError(f"input={str(path)!r}: the directory holds no files")
        return files
    raise BenchError(f"input={str(path)!r}: no such file or directory")


def multipart(field: str, filename: str, content_type: str, data: bytes, boundary: str) -> bytes:
    """A ``multipart/form-data`` body holding one file field (what ``requests.post(files={field: ...})`` sends)."""
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode()


def load_payloads(path: Path | None, content_type: str | None = None, form_field: str | None = None) -> list[Payload]:
    """Read and encode every input once. ``path=None`` sends an empty body."""
    if path is None:
        return [Payload("<empty>", b"", content_type)]
    payloads = []
    boundary = secrets.token_hex(16)
    for file in input_files(path):
        data = file.read_bytes()
        ctype = content_type or guess_content_type(file)
        if form_field:
            body = multipart(form_field, file.name, ctype, data, boundary)
            payloads.append(Payload(file.name, body, f"multipart/form-data; boundary={boundary}"))
        else:
            payloads.append(Payload(file.name, data, ctype))
    return payloads
