"""``torch.export`` with a dynamic batch, shared by the ``export`` and ``aoti`` variants.

The batch dimension (dimension 0 of every input) is exported dynamic, from 1 to :func:`batch_bound`: the stage's
``max_batch`` (the model's ``batchSize``, ``export_max_batch``, the tuner's largest batch) and never less than the
parity check's largest sample. Export runs at a batch of at least 2, since torch.export specializes a dimension of
size 1. What the layout and precision variants of a chain want (a dtype, channels_last) is done inside the exported
graph, as are float32 outputs, so the ``.pt2`` takes and gives what the original model does: a handler serves it
without knowing the chain. A TorchScript module is converted to an ExportedProgram first (TorchScript archives
migrate this way), with torch's TorchScript converter.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from servetune._exceptions import ArchiveError
from servetune.archive.pt2 import DynamicDim
from servetune.optimize._tree import ModelInputs, flat_tensors, map_tensors, rebatch
from servetune.optimize.base import Stage, outputs_to_float32
from servetune.optimize.cache import artifact_path, building
from servetune.optimize.pt2 import load_pt2


def example_batch(stage: Stage) -> int:
    tensors = flat_tensors(stage.example_inputs or ())
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else 1


def batch_bound(stage: Stage) -> int:
    """The largest batch the exported program takes: ``max_batch``, and at least the parity samples' batch."""
    return max(stage.max_batch or 0, example_batch(stage) + 2, 2)


def check_exportable(stage: Stage) -> str | None:
    """Why the stage cannot be exported with a dynamic batch, or None."""
    if stage.example_inputs is None:
        return "torch.export needs example inputs"
    if stage.structured:
        return (
            "the model takes a list of images (a torchvision detector): torch.export fixes a list's length, so the "
            "batch cannot be dynamic (see docs/optimize.md: the detectors do not export)"
        )
    if stage.autocast_dtype is not None:
        return "an exported program does not carry autocast, which reduced precision needs for models fed lists"
    tensors = flat_tensors(stage.example_inputs)
    if not tensors or any(t.dim() == 0 for t in tensors) or len({int(t.shape[0]) for t in tensors}) != 1:
        return "a dynamic batch needs tensor inputs sharing their first (batch) dimension"
    return None


def dynamic_dims(stage: Stage, bound: int) -> list[DynamicDim]:
    """The dynamic dimensions an export of ``stage`` gets: dimension 0 of every input, from 1 to ``bound``."""
    return [DynamicDim(i, 0, 1, bound) for i, _ in enumerate(flat_tensors(stage.example_inputs or ()))]


def dynamic_json(dims: list[DynamicDim]) -> str:
    return json.dumps([d.to_json() for d in dims])


class _Adapted(nn.Module):
    """The module with the chain's input conversion inside, and float32 outputs."""

    def __init__(self, module: nn.Module, dtype: torch.dtype | None, memory_format: torch.memory_format | None):
        super().__init__()
        self.module = module
        self.dtype = dtype
        self.memory_format = memory_format

    def forward(self, *inputs: Any) -> Any:
        def convert(tensor: torch.Tensor) -> torch.Tensor:
            if not tensor.is_floating_point():
                return tensor
            if self.dtype is not None:
                tensor = tensor.to(self.dtype)
            if self.memory_format is not None and tensor.dim() == 4:
                tensor = tensor.contiguous(memory_format=self.memory_format)
            return tensor

        return outputs_to_float32(self.module(*map_tensors(inputs, convert)))


def _from_torchscript(module: torch.jit.ScriptModule, args: ModelInputs) -> nn.Module:
    from torch._export.converter import TS2EPConverter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Manually populate ... num_batches_tracked": unused buffers, harmless
        program = TS2EPConverter(module, tuple(args)).convert()
    converted: nn.Module = program.module()
    return converted


def export_program(stage: Stage, bound: int) -> torch.export.ExportedProgram:
    """Export the stage's module with dimension 0 of every input dynamic in ``[1, bound]``; the program takes the
    source model's inputs (the stage's input conversion is inside it)."""
    assert stage.example_inputs is not None
    args = rebatch(stage.example_inputs, max(2, example_batch(stage)))
    module = stage.module()
    if isinstance(module, torch.jit.ScriptModule):
        module = _from_torchscript(module, args)
        stage.notes.append("converted from TorchScript")
    if stage.input_dtype is not None or stage.memory_format is not None:
        module = _Adapted(module, stage.input_dtype, stage.memory_format)
    batch = torch.export.Dim("batch", min=1, max=bound)
    shapes: tuple[Any, ...] = tuple({0: batch} for _ in args)
    if isinstance(module, _Adapted):
        shapes = (shapes,)  # its forward takes *inputs: one entry, the tuple of them
    with torch.no_grad():
        program = torch.export.export(module, tuple(args), dynamic_shapes=shapes)
    return program


def build_or_load(stage: Stage, extra: str, build: Callable[[Path], None]) -> None:
    """Make the stage's runner a ``.pt2`` loaded for its device: from the cache when it holds one for this model,
    torch, device and ``extra`` (the bounds, ...), else ``build(path)`` writes it first (into the cache, or into a
    scratch directory without one). A cached file that no longer loads is built again. The stage's inputs then
    need no conversion: it is inside the program."""
    path = artifact_path(stage, ".pt2", extra)
    if path is None:
        with tempfile.TemporaryDirectory(prefix="servetune-pt2-") as scratch_dir:
            target = Path(scratch_dir) / "model.pt2"
            build(target)
            stage.runner = load_pt2(target, stage.device)  # loaded into memory: the scratch file may go
            stage.artifact_bytes = target.stat().st_size
    else:
        stage.runner = _cached(stage, path) if path.exists() else None
        if stage.runner is None:
            with building(path) as scratch:
                stage.runner = _cached(stage, path) if path.exists() else None  # built while we waited
                if stage.runner is None:
                    assert scratch is not None
                    build(scratch)
            stage.runner = stage.runner or load_pt2(path, stage.device)
        stage.artifact, stage.artifact_bytes = path, path.stat().st_size
    stage.input_dtype = stage.memory_format = None


def _cached(stage: Stage, path: Path) -> Any:
    try:
        model = load_pt2(path, stage.device)
    except ArchiveError as exc:
        stage.notes.append(f"cached {path.name} did not load ({exc}); built again")
        path.unlink(missing_ok=True)
        return None
    stage.notes.append(f"loaded from cache {path.name}")
    return model
