"""Load a PyTorch 2 ``.pt2`` (an AOTInductor package or a saved ``ExportedProgram``) for one device, checked first.

:func:`load_pt2` reads what the file says about itself (:func:`servetune.archive.pt2.inspect_pt2`, no code run),
refuses it with a message naming the mismatch when it was built for another torch release, device, CPU ISA, CUDA
version or GPU generation (an AOTInductor package is native code: loading a mismatched one can crash the process
rather than fail), and only then loads it:

- an AOTInductor package with ``torch._inductor.aoti_load_package`` (on ``cuda:N``: ``device_index=N``);
- an ``ExportedProgram`` with ``torch.export.load``, moved to the worker's device when it was exported on another
  (``torch.export.passes.move_to_device_pass``: device arguments inside the graph move too), run in Python.

The :class:`Pt2Model` it returns is called like the original model and checks each call's dynamic dimensions
against the bounds the file was exported with: outside them an AOTInductor kernel would read out of bounds, so the
call fails with the bounds and how to raise them instead.
"""

from __future__ import annotations

import platform
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from servetune._exceptions import ArchiveError
from servetune.archive.pt2 import Pt2Info, inspect_pt2
from servetune.optimize._tree import flat_tensors

__all__ = ["Pt2Model", "incompatibility", "load_pt2"]


def _release(version: str) -> str:
    """``2.14.1+cu130`` -> ``2.14.1``: builds of one release share the ABI the package links against."""
    return version.split("+", 1)[0]


def _cpu_isas() -> list[str]:
    from torch._inductor import cpu_vec_isa

    return [str(isa).upper() for isa in cpu_vec_isa.valid_vec_isa_list()]


def _capability(device: torch.device) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def incompatibility(info: Pt2Info, device: torch.device) -> str | None:
    """Why a ``.pt2`` described by ``info`` cannot load on ``device`` in this process, or None when it can."""
    if info.torch_version is not None and _release(info.torch_version) != _release(torch.__version__):
        return (
            f"it was built with torch {info.torch_version} and this worker runs torch {torch.__version__}: "
            "export or compile it again with this torch"
        )
    if info.format == "exported-program":
        if info.device == "cuda" and device.type != "cuda":
            return f"it was exported on cuda and this worker's device is {device}: export it on CPU to serve it here"
        return None  # an ExportedProgram moves between devices (move_to_device_pass)
    if info.device is not None and info.device != device.type:
        return (
            f"it is an AOTInductor package compiled for {info.device} and this worker's device is {device}: "
            f"compile it for {device.type} (servetune optimize --device {device.type} --variants aoti --write)"
        )
    platform_ = info.metadata.get("AOTI_PLATFORM")
    machine = info.metadata.get("AOTI_MACHINE")
    if platform_ and platform_ != sys.platform or machine and machine != platform.machine():
        return f"it was compiled for {platform_}/{machine} and this is {sys.platform}/{platform.machine()}"
    if device.type == "cpu" and info.cpu_isa and info.cpu_isa not in _cpu_isas():
        return (
            f"it was compiled for the CPU vector ISA {info.cpu_isa} and this CPU has "
            f"{', '.join(_cpu_isas()) or 'none of inductor'}'s: compile it on this kind of CPU"
        )
    if device.type == "cuda":
        if info.cuda_version and torch.version.cuda and info.cuda_version != torch.version.cuda:
            return f"it was compiled with CUDA {info.cuda_version} and this torch uses CUDA {torch.version.cuda}"
        if info.compute_capability and info.compute_capability.isdigit():
            built = int(info.compute_capability)
            major, minor = _capability(device)
            if built // 10 != major or built % 10 > minor:
                return (
                    f"it was compiled for compute capability {built // 10}.{built % 10} and {device} is "
                    f"{major}.{minor}: compile it on this kind of GPU"
                )
    return None


class Pt2Model:
    """A loaded ``.pt2``, called like the model it was exported from; ``info`` says what it is.

    Not an ``nn.Module``: its weights are the program's, on its device, in its dtypes (a bf16 program still takes
    float32 inputs), so nothing should move, cast or inspect them from outside. ``eval()`` is accepted, as handlers
    call it on whatever they loaded."""

    def __init__(self, runner: Any, info: Pt2Info, path: Path, device: torch.device) -> None:
        self.info = info
        self.path = path
        self.device = device
        self.runner = runner

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        tensors = flat_tensors(inputs)
        for dim in self.info.dynamic:
            if dim.input >= len(tensors) or dim.dim >= tensors[dim.input].dim():
                continue
            size = int(tensors[dim.input].shape[dim.dim])
            if size < dim.min or (dim.max is not None and size > dim.max):
                what = "batch" if dim.dim == 0 else f"dimension {dim.dim}"
                raise ValueError(
                    f"a {what} of {size} (input {dim.input}) is outside [{dim.min}, {dim.max}], the bounds "
                    f"{self.path.name} was exported with: export it again with a larger export_max_batch "
                    "(model-config.yaml), or keep batchSize within them"
                )
        return self.runner(*inputs, **kwargs)

    def eval(self) -> Pt2Model:
        return self

    def __repr__(self) -> str:
        return f"Pt2Model(format={self.info.format!r}, path={self.path.name!r}, device={self.device})"


def load_pt2(path: str | Path, device: torch.device) -> Pt2Model:
    """Load ``path`` for ``device`` after checking it was built for it; ArchiveError says what does not match (or
    that the file is not a readable ``.pt2``)."""
    path = Path(path)
    if not path.is_file():
        raise ArchiveError(f"{path.name}: no such .pt2 file")
    info = inspect_pt2(path)
    reason = incompatibility(info, device)
    if reason is not None:
        raise ArchiveError(f"cannot load {path.name} ({info.summary()}): {reason}")
    try:
        runner = _load(path, info, device)
    except Exception as exc:  # a truncated weight, a missing kernel: say which file and why
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ArchiveError(f"cannot load {path.name} ({info.summary()}): {type(exc).__name__}: {first}") from exc
    return Pt2Model(runner, info, path, device)


def _load(path: Path, info: Pt2Info, device: torch.device) -> Any:
    if info.format == "aoti":
        from torch._inductor import aoti_load_package

        index = -1  # CPU
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
        return aoti_load_package(str(path), device_index=index)
    with warnings.catch_warnings():
        # torch.export.load of low-precision weights: "No complete tensor found in the group!" (harmless on CPU)
        warnings.filterwarnings("ignore", message="No complete tensor found")
        program = torch.export.load(str(path))
    if info.device != device.type or device.type == "cuda":  # cuda: onto this worker's own GPU
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    return program.module()
