"""Where converted artifacts live: ``<cache_dir>/<variant>-<key><suffix>``.

The key hashes what a conversion depends on: the variant, the torch version, the device type, the model's
structure, source and weights, and the example inputs' dtypes and shapes past the batch dimension. A stale
artifact would still be caught by the parity check, which runs on every load.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import torch

from servetune.optimize._tree import flat_tensors
from servetune.optimize.base import Stage


def cache_key(stage: Stage) -> str:
    """A 16-hex-digit digest of everything the stage's conversion depends on."""
    digest = hashlib.sha256()
    model = stage.source

    def add(text: str) -> None:
        digest.update(text.encode())
        digest.update(b"\0")

    add(stage.name)
    add(torch.__version__)
    add(stage.device.type)
    add(type(model).__qualname__)
    add(repr(model))
    add(str(getattr(model, "code", "")))
    try:
        add(inspect.getsource(type(model)))
    except (OSError, TypeError):
        pass  # built-in or dynamically made class: structure and weights still count
    for name, tensor in model.state_dict().items():
        add(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}")
        data = tensor.detach().cpu().contiguous()
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    for tensor in flat_tensors(stage.example_inputs or ()):
        add(f"input:{tensor.dtype}:{tuple(tensor.shape[1:])}")
    return digest.hexdigest()[:16]


def artifact_path(stage: Stage, suffix: str) -> Path | None:
    """The artifact's path in the stage's cache directory (created), or None when the stage has no cache."""
    if stage.cache_dir is None:
        return None
    stage.cache_dir.mkdir(parents=True, exist_ok=True)
    safe = stage.name.replace("+", "_")
    return stage.cache_dir / f"{safe}-{cache_key(stage)}{suffix}"
