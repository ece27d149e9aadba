"""Walking the nested tensors of model inputs and outputs (tuples, lists, dicts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

ModelInputs = tuple[Any, ...]
"""Positional arguments of a model call: tensors, or lists/dicts of them (detection models take a list)."""


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor inside nested tuples, lists and dicts, keeping the structure."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [map_tensors(item, fn) for item in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [map_tensors(item, fn) for item in obj]
    if isinstance(obj, dict):
        return {key: map_tensors(value, fn) for key, value in obj.items()}
    return obj


def flat_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside ``obj``, in traversal order."""
    found: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    map_tensors(obj, keep)
    return found


def is_structured(inputs: ModelInputs) -> bool:
    """True when the call takes something other than plain tensors (a detection model's list of images)."""
    return any(not isinstance(arg, torch.Tensor) for arg in inputs)


def rebatch(inputs: ModelInputs, size: int) -> ModelInputs:
    """The inputs with their batch dimension cycled to ``size`` rows."""

    def cycle(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or tensor.shape[0] == 0:
            return tensor
        index = torch.arange(size, device=tensor.device) % tensor.shape[0]
        return tensor.index_select(0, index)

    cycled: ModelInputs = map_tensors(tuple(inputs), cycle)
    return cycled
