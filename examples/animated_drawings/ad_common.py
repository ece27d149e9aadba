"""Shared by both Animated Drawings handlers (packed into both archives): settings, weights, describe.

Settings live under one model-config.yaml section per model (``detector:`` or ``pose:``); unknown keys and wrong
types fail the load with a message naming the key. Weights are the archive's serialized file (random weights
generated with a fixed seed when the archive was built, see ``make_archives.py``) unless the section names a
``weights`` file: a state_dict (optionally wrapped as ``{"state_dict": ...}`` or ``{"model": ...}``), always loaded
with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: written into each archive by make_archives.py: how its serialized weights were made
WEIGHTS_INFO_FILE = "weights_info.json"


def read_settings(config: Mapping[str, Any], section: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with model-config.yaml's ``section`` mapping, every value checked against its default."""
    given = config.get(section) or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"model-config.yaml {section}: expected a mapping of settings, got {given!r}")
    unknown = sorted(set(given) - set(defaults) - {"weights"})
    if unknown:
        raise ValueError(f"model-config.yaml {section}: unknown keys {unknown}; expected some of {sorted(defaults)}")
    result: dict[str, Any] = {**defaults, "weights": None}
    for key, value in given.items():
        default = result[key]
        if key == "weights":
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"model-config.yaml {section}.weights={value!r}: expected a file path")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model-config.yaml {section}.{key}={value!r}: expected a positive integer")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"model-config.yaml {section}.{key}={value!r}: expected a number >= 0")
        result[key] = value
    return result


def weights_file(settings: Mapping[str, Any], model_dir: Path, serialized: str | None) -> Path:
    """The configured ``weights`` (absolute, or relative to the model directory), else the archive's own."""
    configured = settings.get("weights")
    if configured:
        path = Path(configured).expanduser()
        path = path if path.is_absolute() else model_dir / path
        if not path.is_file():
            raise FileNotFoundError(f"model-config.yaml weights={configured!r}: no such file ({path})")
        return path
    if serialized is None:
        raise FileNotFoundError("no weights: the archive has no serializedFile and model-config.yaml sets no weights")
    return Path(serialized)


def load_weights(model: nn.Module, path: Path) -> None:
    """Load a state_dict saved by ``torch.save`` (``weights_only=True``: tensors and containers only)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    model.load_state_dict(state)


def weights_provenance(path: Path, model_dir: Path, configured: bool) -> dict[str, Any]:
    """What the served weights are, for ``describe``: the archive's seeded random weights, or a named file."""
    info_file = model_dir / WEIGHTS_INFO_FILE
    if not configured and info_file.is_file():
        info: dict[str, Any] = json.loads(info_file.read_text())
        return info
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return {"source": "file", "path": str(path), "sha256": digest.hexdigest()}


def input_dtype(model: Any) -> torch.dtype:
    """The dtype of the model's floating weights (float32 for non-modules and weightless models).

    Variants from servetune's optimize layer convert inputs themselves; this only matters for a model cast by
    hand (``model.half()``), whose inputs must match its weights.
    """
    if isinstance(model, nn.Module):
        for parameter in model.parameters():
            if parameter.is_floating_point():
                return parameter.dtype
    return torch.float32
