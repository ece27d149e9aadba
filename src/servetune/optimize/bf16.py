"""``bf16``: bfloat16 weights and activations, on CPU and on CUDA devices that support it.

Fast on CPUs with AVX512-BF16 or AMX; elsewhere PyTorch emulates it and it may be slower than fp32 (measure).
"""

from __future__ import annotations

import torch

from servetune.optimize._precision import apply_precision
from servetune.optimize.base import Stage, Variant
from servetune.optimize.parity import Tolerance


class Bf16(Variant):
    name = "bf16"
    kind = "precision"
    tolerance = Tolerance(atol=1e-2, rtol=5e-2, min_top1=0.8, min_box_iou=0.9, max_score_diff=0.05, min_match=0.9)

    def check(self, stage: Stage) -> str | None:
        if stage.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return f"this CUDA device ({torch.cuda.get_device_name(stage.device)}) does not support bfloat16"
        if stage.device.type not in ("cpu", "cuda"):
            return f"bf16 is offered on cpu and cuda, not {stage.device.type}"
        return None

    def apply(self, stage: Stage) -> None:
        apply_precision(stage, torch.bfloat16)
