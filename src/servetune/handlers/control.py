"""A request's control data: what the server decided about it from the route it came in by, typed, per request.

The protocol (TorchServe's own routes, KServe v1, OIP v2), whether it asks for an explanation
and whether it is TorchServe's describe call travel as a :class:`Control` beside each request (``InferRequest`` in the
API, each item of the worker's ``Predict``, each ``Request`` a handler batch is built from), never as headers: a client
could send a header of the same name, and a handler reading request 0's header decides for the whole batch.

What a handler sees: the client's headers without :func:`reserved` ones (``explain``, ``describe``, any
``x-servetune-*``), plus the control headers TorchServe's handlers read (``context.get_request_header(0, "explain")``
is ``"True"`` only for an explain request, ``"describe"`` only on a describe call), set by the worker from the typed
fields. Requests of different control never share a handler call (:meth:`Control.key`): the worker splits a batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TORCHSERVE = "torchserve"  # TorchServe's own routes: the configured ``service_envelope``, if any
KSERVE_V1 = "kserve-v1"
OIP_V2 = "oip-v2"
PROTOCOLS = (TORCHSERVE, KSERVE_V1, OIP_V2)

EXPLAIN_HEADER = "explain"
DESCRIBE_HEADER = "describe"
RESERVED_PREFIX = "x-servetune-"
# On the handler class or module: explain requests reach ``handle`` (a handler without ``explain_handle`` gets 501).
EXPLAINS_ATTRIBUTE = "servetune_explains"


@dataclass(frozen=True, slots=True)
class Control:
    """What the server decided about one request (see the module)."""

    protocol: str = TORCHSERVE
    explain: bool = False
    describe: bool = False
    # Requests with the same key may share a handler call; others never do. Also its form on the worker's wire
    # (``from_json`` reads it back). Computed once: the API builds one Control per kind of request, not per request.
    key: tuple[str, bool, bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol={self.protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        object.__setattr__(self, "key", (self.protocol, self.explain, self.describe))

    @classmethod
    def from_json(cls, raw: Any) -> Control:
        if raw is None:
            return DEFAULT
        protocol, explain, describe = raw
        if not isinstance(explain, bool) or not isinstance(describe, bool):
            raise ValueError(f"control {raw!r}: explain and describe must be booleans")
        return cls(str(protocol), explain, describe)


DEFAULT = Control()


def reserved(name: str) -> bool:
    """A header name the server owns: a client's copy never reaches a handler (any case)."""
    lowered = name.lower()
    return lowered in (EXPLAIN_HEADER, DESCRIBE_HEADER) or lowered.startswith(RESERVED_PREFIX)


def handler_headers(headers: Mapping[str, Any], control: Control) -> dict[str, Any]:
    """The headers a handler reads for one request: the client's, less the reserved ones, plus the control headers
    TorchServe's handlers read (``explain`` always, ``describe`` on a describe call)."""
    out = {k: v for k, v in headers.items() if not reserved(k)}
    out[EXPLAIN_HEADER] = "True" if control.explain else "False"
    if control.describe:
        out[DESCRIBE_HEADER] = "True"
    return out


def handler_explains(owner: Any) -> bool:
    """Whether a handler answers explain requests: its class has ``explain_handle`` (``BaseHandler`` and its
    subclasses), or it says so with ``servetune_explains = True`` (a function handler that reads the header)."""
    flag = getattr(owner, EXPLAINS_ATTRIBUTE, None)
    if flag is not None:
        return bool(flag)
    return callable(getattr(owner, "explain_handle", None))


__all__ = [
    "DEFAULT",
    "DESCRIBE_HEADER",
    "EXPLAINS_ATTRIBUTE",
    "EXPLAIN_HEADER",
    "KSERVE_V1",
    "OIP_V2",
    "PROTOCOLS",
    "RESERVED_PREFIX",
    "TORCHSERVE",
    "Control",
    "handler_explains",
    "handler_headers",
    "reserved",
]
