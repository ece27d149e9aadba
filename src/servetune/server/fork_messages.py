"""The frontend <-> model parent messages, typed (the parent: ``servetune.server.forkserver``).

    frontend -> parent   Preload    the model to load and how far (the WorkerSpec, ``model`` or ``imports``): first
                         Fork       fork a worker; the worker's end of its socket pair travels with the frame
    parent -> frontend   Preloaded  ready to fork (its pid, the time it took), or why it must not fork (``hazard``)
                         LoadError  the handler could not load (``servetune.server.messages.LoadError``)
                         Forked     the worker's pid, and a pidfd of it with the frame (or why the fork failed)
                         Exited     a worker it forked exited: its exit code as ``Popen.returncode`` gives it

Frames of ``servetune.server.messages``, as the worker messages are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servetune.handlers.spec import WorkerSpec
from servetune.server.messages import LoadError, decode_typed, encode

LEVELS = ("model", "imports")


@dataclass(slots=True)
class Preload:
    spec: WorkerSpec
    level: str  # "model": load the model; "imports": import the handler's module only

    def encode(self) -> bytes:
        return encode({"type": "preload", "spec": self.spec.to_json(), "level": self.level})

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Preload:
        level = str(header["level"])
        if level not in LEVELS:
            raise ValueError(f"unknown preload level {level!r}")
        return cls(WorkerSpec.from_json(header["spec"]), level)


@dataclass(slots=True)
class Preloaded:
    pid: int
    load_ms: float  # the preload itself (imports, and the model at level "model")
    interpreter_ms: float  # exec to servetune's parent module
    imports_ms: float  # that module's imports
    torch: bool  # torch is loaded in the parent (what the workers will share)
    hazard: str = ""  # not empty: why the parent must not fork (threads, CUDA, open files); it exits
    early_ms: float = 0.0  # the imports it ran before it was sent the model (``servetune.server.early``)

    def encode(self) -> bytes:
        return encode(
            {
                "type": "preloaded",
                "pid": self.pid,
                "load_ms": self.load_ms,
                "interpreter_ms": self.interpreter_ms,
                "imports_ms": self.imports_ms,
                "torch": self.torch,
                "hazard": self.hazard,
                "early_ms": self.early_ms,
            }
        )

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Preloaded:
        return cls(
            int(header["pid"]),
            float(header["load_ms"]),
            float(header["interpreter_ms"]),
            float(header["imports_ms"]),
            bool(header["torch"]),
            str(header.get("hazard") or ""),
            float(header.get("early_ms") or 0.0),
        )


@dataclass(slots=True)
class Fork:
    """Fork one worker; sent with one file descriptor: the worker's end of its socket pair."""

    seq: int

    def encode(self) -> bytes:
        return encode({"type": "fork", "seq": self.seq}, fds=1)

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Fork:
        return cls(int(header["seq"]))


@dataclass(slots=True)
class Forked:
    """The answer to ``Fork`` ``seq``: the worker's pid, sent with a pidfd of it; or ``error`` (pid 0, no pidfd)."""

    seq: int
    pid: int
    error: str = ""

    def encode(self) -> bytes:
        header = {"type": "forked", "seq": self.seq, "pid": self.pid, "error": self.error}
        return encode(header, fds=0 if self.error else 1)

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Forked:
        return cls(int(header["seq"]), int(header["pid"]), str(header.get("error") or ""))


@dataclass(slots=True)
class Exited:
    pid: int
    returncode: int  # as Popen.returncode: the exit code, or -N for signal N

    def encode(self) -> bytes:
        return encode({"type": "exited", "pid": self.pid, "returncode": self.returncode})

    @classmethod
    def decode(cls, header: dict[str, Any], blobs: list[bytes]) -> Exited:
        return cls(int(header["pid"]), int(header["returncode"]))


ForkMessage = Preload | Preloaded | Fork | Forked | Exited | LoadError
_TYPES: dict[str, Any] = {
    "preload": Preload,
    "preloaded": Preloaded,
    "fork": Fork,
    "forked": Forked,
    "exited": Exited,
    "load_error": LoadError,
}


def decode_fork_message(header: dict[str, Any], blobs: list[bytes]) -> ForkMessage:
    message: ForkMessage = decode_typed(_TYPES, header, blobs)
    return message


__all__ = ["LEVELS", "Exited", "Fork", "ForkMessage", "Forked", "Preload", "Preloaded", "decode_fork_message"]
