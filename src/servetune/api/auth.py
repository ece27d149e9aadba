"""Bearer-token authorization, TorchServe's scheme (docs/token_authorization_api.md).

On start a ``key_file.json`` (mode 0600) is written with three keys: ``management`` (required on the
management API), ``inference`` (required on the inference API when ``inference_token_authorization=true``)
and ``API`` (regenerates the other two through ``GET /token``). Management and inference keys expire
after ``token_expiration_min``. The metrics API and ``OPTIONS /`` are never token-checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

_BEARER = re.compile(r"^Bearer\s+(\S+)$")


def _new_key() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class _Key:
    value: str
    expires: float | None

    def valid(self, presented: str) -> bool:
        fresh = self.expires is None or time.time() < self.expires
        return fresh and secrets.compare_digest(self.value.encode(), presented.encode())


class TokenStore:
    def __init__(self, key_file: Path, expiration_min: int) -> None:
        self.key_file = key_file
        self.expiration_s = expiration_min * 60
        self.keys: dict[str, _Key] = {}
        for kind in ("management", "inference"):
            self.keys[kind] = _Key(_new_key(), time.time() + self.expiration_s)
        self.keys["API"] = _Key(_new_key(), None)
        self._write()

    def _write(self) -> None:
        payload = {
            kind: {"key": key.value, **({"expiration time": _iso(key.expires)} if key.expires else {})}
            for kind, key in self.keys.items()
        }
        self.key_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.key_file.with_name(self.key_file.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=2)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.key_file)

    def check(self, kind: str, authorization: str | None) -> bool:
        if not authorization:
            return False
        match = _BEARER.match(authorization.strip())
        return match is not None and self.keys[kind].valid(match.group(1))

    def regenerate(self, kind: str) -> str:
        self.keys[kind] = _Key(_new_key(), time.time() + self.expiration_s)
        self._write()
        return self.keys[kind].value

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.key_file.unlink()


def _iso(ts: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts or 0))
