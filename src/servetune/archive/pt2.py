"""What a PyTorch 2 ``.pt2`` file holds, read from the zip without importing torch or loading any code.

A ``.pt2`` is a zip in PyTorch's PT2 archive format (``<root>/archive_format`` says ``pt2``). It holds either a
saved ``ExportedProgram`` (``torch.export.save``: ``<root>/models/<name>.json``, the graph run in Python) or an
AOTInductor package (``torch._inductor.aoti_compile_and_package``: ``<root>/data/aotinductor/<name>/``, a compiled
shared library with its ``*_metadata.json``). :func:`inspect_pt2` says which, the device it was built for, the torch
version it was built with, and its dynamic dimensions with their bounds:

- an ExportedProgram records the torch version, its inputs' devices and shapes, and ``range_constraints``;
- an AOTInductor package records its device (``AOTI_DEVICE_KEY``), the CPU ISA or CUDA compute capability it was
  compiled for, and whatever metadata its builder added: servetune's ``aoti`` variant adds the torch version, the
  CUDA version and the dynamic dimensions (:data:`META_TORCH`, :data:`META_CUDA`, :data:`META_DYNAMIC`). A package
  built elsewhere may lack them; they are then ``None`` / empty, and said to be unknown.

Used by the archiver (the manifest's ``pt2`` entry), the handlers (the checks before loading) and ``describe``.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servetune._exceptions import ArchiveError

__all__ = [
    "META_CUDA",
    "META_DYNAMIC",
    "META_TORCH",
    "DynamicDim",
    "Pt2Info",
    "inspect_pt2",
    "is_pt2",
]

Pt2Format = Literal["aoti", "exported-program"]

#: AOTInductor metadata keys servetune writes when it compiles a package
META_TORCH = "servetune.torch_version"
META_CUDA = "servetune.cuda_version"
META_DYNAMIC = "servetune.dynamic"

_SYMBOL = re.compile(r"^(?:Symbol\('([A-Za-z_]\w*)'.*\)|([A-Za-z_]\w*))$")


@dataclass(frozen=True)
class DynamicDim:
    """Dimension ``dim`` of input ``input`` (its position among the model's positional inputs) may take any size
    from ``min`` to ``max``."""

    input: int
    dim: int
    min: int
    max: int | None  # None: unbounded above

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "dim": self.dim, "min": self.min, "max": self.max}

    @classmethod
    def from_json(cls, raw: Any) -> DynamicDim:
        if not isinstance(raw, dict) or not {"input", "dim", "min"} <= raw.keys():
            raise ValueError(f"expected {{input, dim, min, max}}, got {raw!r}")
        top = raw.get("max")
        return cls(int(raw["input"]), int(raw["dim"]), int(raw["min"]), None if top is None else int(top))

    def describe(self) -> str:
        return f"input {self.input} dim {self.dim} in [{self.min}, {'inf' if self.max is None else self.max}]"


@dataclass(frozen=True)
class Pt2Info:
    """What a ``.pt2`` file says about itself."""

    format: Pt2Format
    torch_version: str | None  # None: not recorded (an AOTInductor package built outside servetune)
    device: str | None  # "cpu", "cuda", ...
    dynamic: tuple[DynamicDim, ...] = ()
    cuda_version: str | None = None
    cpu_isa: str | None = None  # AOTInductor on CPU: the vector ISA the kernels were compiled for
    compute_capability: str | None = None  # AOTInductor on CUDA, e.g. "90"
    metadata: dict[str, str] = field(default_factory=dict)

    def batch_bounds(self) -> tuple[int, int | None] | None:
        """The bounds of dimension 0 when every input's dimension 0 is dynamic with the same bounds; else None."""
        firsts = {(d.min, d.max) for d in self.dynamic if d.dim == 0}
        inputs = {d.input for d in self.dynamic if d.dim == 0}
        return next(iter(firsts)) if len(firsts) == 1 and inputs else None

    def to_json(self) -> dict[str, Any]:
        """The manifest's and describe's form (camelCase keys, as the rest of the manifest)."""
        out: dict[str, Any] = {
            "format": self.format,
            "torchVersion": self.torch_version,
            "device": self.device,
            "dynamic": [d.to_json() for d in self.dynamic],
        }
        if self.cuda_version:
            out["cudaVersion"] = self.cuda_version
        if self.cpu_isa:
            out["cpuIsa"] = self.cpu_isa
        if self.compute_capability:
            out["computeCapability"] = self.compute_capability
        return out

    def summary(self) -> str:
        dims = "; ".join(d.describe() for d in self.dynamic) or "none"
        kind = "AOTInductor package" if self.format == "aoti" else "ExportedProgram"
        return (
            f"{kind} for {self.device or 'an unrecorded device'}, built with torch "
            f"{self.torch_version or '(not recorded)'}, dynamic dimensions: {dims}"
        )


def is_pt2(path: str | os.PathLike[str]) -> bool:
    """True for a file named ``*.pt2`` (what the handlers load as PyTorch 2's format)."""
    return Path(path).suffix == ".pt2"


def inspect_pt2(path: str | os.PathLike[str]) -> Pt2Info:
    """Read ``path``'s format, device, torch version and dynamic dimensions; ArchiveError when it is not a readable
    PT2 archive (not a zip, truncated, or neither an ExportedProgram nor an AOTInductor package)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            aoti = sorted(n for n in names if "/data/aotinductor/" in n and n.endswith("_metadata.json"))
            programs = sorted(n for n in names if re.fullmatch(r"[^/]+/models/[^/]+\.json", n))
            if aoti:
                return _aoti_info(archive, aoti)
            if programs:
                return _program_info(archive, programs[0], names)
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError, TypeError) as exc:
        raise ArchiveError(f"{path.name} is not a readable .pt2 archive: {type(exc).__name__}: {exc}") from exc
    raise ArchiveError(
        f"{path.name} is a zip but neither a saved ExportedProgram (torch.export.save) nor an AOTInductor package "
        "(torch._inductor.aoti_compile_and_package)"
    )


def _aoti_info(archive: zipfile.ZipFile, metadata_files: list[str]) -> Pt2Info:
    metadata: dict[str, str] = {}
    for name in metadata_files:  # the wrapper's and the kernels' metadata: the same keys
        loaded = json.loads(archive.read(name))
        if isinstance(loaded, dict):
            metadata.update({str(k): str(v) for k, v in loaded.items()})
    dynamic: tuple[DynamicDim, ...] = ()
    if META_DYNAMIC in metadata:
        dynamic = tuple(DynamicDim.from_json(d) for d in json.loads(metadata[META_DYNAMIC]))
    return Pt2Info(
        format="aoti",
        torch_version=metadata.get(META_TORCH) or None,
        device=metadata.get("AOTI_DEVICE_KEY") or None,
        dynamic=dynamic,
        cuda_version=metadata.get(META_CUDA) or None,
        cpu_isa=metadata.get("AOTI_CPU_ISA") or None,
        compute_capability=metadata.get("AOTI_COMPUTE_CAPABILITY") or None,
        metadata=metadata,
    )


def _program_info(archive: zipfile.ZipFile, model_json: str, names: list[str]) -> Pt2Info:
    program = json.loads(archive.read(model_json))
    graph_module = program["graph_module"]
    tensors = graph_module["graph"]["tensor_values"]
    ranges = program.get("range_constraints") or {}
    user_inputs = [
        spec["user_input"]["arg"].get("as_tensor", {}).get("name")
        for spec in graph_module["signature"]["input_specs"]
        if "user_input" in spec
    ]
    dynamic: list[DynamicDim] = []
    devices: list[str] = []
    for position, name in enumerate(user_inputs):
        meta = tensors.get(name) if name else None
        if not meta:
            continue  # a non-tensor input
        devices.append(str((meta.get("device") or {}).get("type") or ""))
        for dim, size in enumerate(meta.get("sizes") or []):
            expr = (size.get("as_expr") or {}).get("expr_str")
            match = _SYMBOL.match(expr) if isinstance(expr, str) else None
            symbol = (match.group(1) or match.group(2)) if match else None
            bounds = ranges.get(symbol) if symbol else None
            if bounds:
                top = bounds.get("max_val")
                finite = isinstance(top, int) and top < 2**62
                dynamic.append(DynamicDim(position, dim, int(bounds.get("min_val") or 0), int(top) if finite else None))
    device = next((d for d in devices if d), None) or _weights_device(archive, model_json, names)
    return Pt2Info(
        format="exported-program",
        torch_version=program.get("torch_version") or None,
        device=device,
        dynamic=tuple(dynamic),
    )


def _weights_device(archive: zipfile.ZipFile, model_json: str, names: list[str]) -> str | None:
    root = model_json.split("/", 1)[0]
    config = next((n for n in names if n.startswith(f"{root}/data/weights/") and n.endswith("_config.json")), None)
    if config is None:
        return None
    weights = json.loads(archive.read(config)).get("config") or {}
    for entry in weights.values():
        device = ((entry.get("tensor_meta") or {}).get("device") or {}).get("type")
        if device:
            return str(device)
    return None
