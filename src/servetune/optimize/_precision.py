"""Shared by the reduced-precision variants (fp16, bf16)."""

from __future__ import annotations

import torch
from torch import nn

from servetune.optimize.base import Stage


def apply_precision(stage: Stage, dtype: torch.dtype) -> None:
    """Cast weights and floating inputs to ``dtype``, or, for models fed lists (torchvision detectors, whose NMS and
    box coding need fp32), keep fp32 weights and run under autocast."""
    if stage.structured:
        stage.autocast_dtype = dtype
        stage.notes.append(f"autocast to {str(dtype).removeprefix('torch.')}: the model takes structured inputs")
        return

    def cast(module: nn.Module) -> nn.Module:
        return module.to(dtype)

    stage.transforms.append(cast)
    stage.input_dtype = dtype
