"""What every variant shares: the :class:`Stage` a variant chain works on, the :class:`Variant` interface,
and :class:`VariantModel`, the callable a chain produces.

A chain runs in kind order: ``layout`` (memory format), ``precision`` (dtype or quantization), then at most one
``backend`` (TorchScript, torch.compile, ONNX Runtime, torch.export, AOTInductor). Layout and precision variants
only record what they want (``Stage.transforms``, input dtype and format); the module is built once, on a copy,
when something asks for it, so a backend that finds its artifact in the cache never builds it at all.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from servetune.optimize._tree import ModelInputs, is_structured, map_tensors
from servetune.optimize.parity import ParityReport, Tolerance

Kind = Literal["baseline", "layout", "precision", "backend"]
KIND_ORDER: dict[str, int] = {"baseline": 0, "layout": 1, "precision": 2, "backend": 3}


def convert_inputs(
    inputs: ModelInputs, device: torch.device, dtype: torch.dtype | None, memory_format: torch.memory_format | None
) -> ModelInputs:
    """Move inputs to ``device``; floating tensors to ``dtype``, 4-D floating tensors to ``memory_format``."""

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point():
            return tensor.to(device)
        fmt = memory_format if memory_format is not None and tensor.dim() == 4 else torch.preserve_format
        return tensor.to(device=device, dtype=dtype or tensor.dtype, memory_format=fmt)

    converted: ModelInputs = map_tensors(tuple(inputs), convert)
    return converted


def outputs_to_float32(outputs: Any) -> Any:
    """Half and bfloat16 tensors to float32, channels_last tensors to contiguous: postprocess stays unchanged."""

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dtype in (torch.float16, torch.bfloat16):
            tensor = tensor.float()
        if tensor.dim() == 4 and not tensor.is_contiguous():
            tensor = tensor.contiguous()
        return tensor

    return map_tensors(outputs, convert)


@dataclass
class Stage:
    """The model as it passes through a chain of variants."""

    name: str
    source: nn.Module
    device: torch.device
    example_inputs: ModelInputs | None
    cache_dir: Path | None = None
    max_batch: int | None = None  # the largest batch an exported variant must take (its dynamic batch's bound)
    input_dtype: torch.dtype | None = None
    memory_format: torch.memory_format | None = None
    autocast_dtype: torch.dtype | None = None
    transforms: list[Callable[[nn.Module], nn.Module]] = field(default_factory=list)
    runner: Callable[..., Any] | None = None
    artifact: Path | None = None
    artifact_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    _built: nn.Module | None = field(default=None, init=False, repr=False)

    @property
    def structured(self) -> bool:
        return self.example_inputs is not None and is_structured(self.example_inputs)

    def module(self) -> nn.Module:
        """The source model with every recorded transform applied (on a copy: the source stays the reference)."""
        if self._built is None:
            built = copy.deepcopy(self.source) if self.transforms else self.source
            for transform in self.transforms:
                built = transform(built)
            self._built = built.eval()
        return self._built

    def adapt(self, inputs: ModelInputs) -> ModelInputs:
        """Inputs as the transformed module wants them."""
        return convert_inputs(inputs, self.device, self.input_dtype, self.memory_format)


class Variant:
    """One model variant. Subclasses set the class attributes and override :meth:`check` and :meth:`apply`."""

    name: ClassVar[str]
    kind: ClassVar[Kind]
    tolerance: ClassVar[Tolerance] = Tolerance()

    def check(self, stage: Stage) -> str | None:
        """Return why this variant cannot apply to ``stage`` (model, device, inputs), or None when it can."""
        return None

    def apply(self, stage: Stage) -> None:
        """Record or perform the conversion on ``stage``; raise anything on failure (it becomes not-applicable)."""
        raise NotImplementedError


class VariantModel(nn.Module):
    """A converted model, called exactly like the original: it converts inputs to what the variant needs and
    returns float32, contiguous outputs. ``parity`` holds the check against eager, when one ran."""

    def __init__(
        self, stage: Stage, runner: Callable[..., Any], convert_seconds: float, parity: ParityReport | None = None
    ) -> None:
        super().__init__()
        self.variant = stage.name
        self.runner = runner  # registered as a submodule when it is one, so .eval() and .parameters() reach it
        self.device = stage.device
        self.input_dtype = stage.input_dtype
        self.memory_format = stage.memory_format
        self.autocast_dtype = stage.autocast_dtype
        self.artifact = stage.artifact
        self.artifact_bytes = stage.artifact_bytes
        self.notes = list(stage.notes)
        self.warnings: list[str] = []  # what the conversion warned about, once each
        self.convert_seconds = convert_seconds
        self.parity = parity

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        args = convert_inputs(inputs, self.device, self.input_dtype, self.memory_format)
        (options,) = convert_inputs((kwargs,), self.device, self.input_dtype, self.memory_format)
        autocast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.autocast_dtype is not None:
            autocast = torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
        with torch.inference_mode(), autocast:  # as handlers call models: no autograd, no recompiles
            outputs = self.runner(*args, **options)
        return outputs_to_float32(outputs)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, device={self.device}"
