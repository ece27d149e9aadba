"""What one tensor of a request may claim, and the errors of the OIP tensor codec (``servetune.tensors``).

A tensor's shape is checked before any of its data is decoded (:meth:`TensorLimits.check`): its dimensions, its
elements, and what an empty tensor's nested form holds (``[10000000, 0]`` has no element, but the ``kservev2``
envelope hands a handler ten million empty lists). The defaults and the config keys: docs/limits.md. JSON is read
strictly (:func:`strict_json`): ``NaN`` and ``Infinity`` are not JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servetune._exceptions import ServetuneError


class TensorError(ServetuneError, ValueError):
    """A tensor, or a request or response holding it, is invalid (a server answers it 400)."""


class TensorLimitError(TensorError):
    """A tensor is over one of the server's :class:`TensorLimits` (a server answers it 413)."""


@dataclass(frozen=True)
class TensorLimits:
    """What one tensor of a request may claim (docs/limits.md): checked on its shape, before its data is decoded."""

    max_elements: int = 16_777_216  # elements, a 0 dimension counted as 1 (what numpy must be able to build)
    max_dims: int = 32
    max_empty_span: int = 65536  # an empty tensor's dimensions multiplied, each 0 counted as 1

    def check(self, name: str, shape: Sequence[int]) -> None:
        """Raise TensorError for a shape that is not a list of sizes (``-1``: inferred), TensorLimitError for one
        over a limit."""
        if len(shape) > self.max_dims:
            raise TensorLimitError(
                f"input {name!r}: {len(shape)} dimensions, more than max_tensor_dims ({self.max_dims})"
            )
        span = 1
        for d in shape:
            if not isinstance(d, int) or isinstance(d, bool) or d < -1:
                raise TensorError(f"input {name!r}: shape {_short(shape)}: expected sizes >= 0 (one may be -1)")
            span *= max(d, 1)
        if span > self.max_elements:
            raise TensorLimitError(
                f"input {name!r}: shape {_short(shape)} holds {span} elements, more than max_tensor_elements "
                f"({self.max_elements})"
            )
        if 0 in shape and span > self.max_empty_span:
            raise TensorLimitError(
                f"input {name!r}: the empty shape {_short(shape)} spans {span} entries, more than "
                f"max_empty_tensor_span ({self.max_empty_span})"
            )


NO_LIMITS = TensorLimits(2**62, 64, 2**62)  # numpy's own bounds: what a response may hold
DEFAULT_LIMITS = TensorLimits()


def _short(shape: Sequence[Any]) -> str:
    text = str(list(shape))
    return text if len(text) <= 80 else text[:77] + "..."


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON (send such values in binary)")


def strict_json(text: bytes | bytearray | str) -> Any:
    """``json.loads`` without Python's extensions: ``NaN``, ``Infinity`` and ``-Infinity`` are refused."""
    return json.loads(text, parse_constant=_not_json)


__all__ = ["DEFAULT_LIMITS", "NO_LIMITS", "TensorError", "TensorLimitError", "TensorLimits", "strict_json"]
