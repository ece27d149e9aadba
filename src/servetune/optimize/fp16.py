"""``fp16``: half precision weights and activations, CUDA only (the case study's ``model.half()``)."""

from __future__ import annotations

import torch

from servetune.optimize._precision import apply_precision
from servetune.optimize.base import Stage, Variant
from servetune.optimize.parity import Tolerance


class Fp16(Variant):
    name = "fp16"
    kind = "precision"
    tolerance = Tolerance(atol=1e-3, rtol=1e-2, min_top1=0.9, min_box_iou=0.95, max_score_diff=0.02, min_match=0.95)

    def check(self, stage: Stage) -> str | None:
        if stage.device.type != "cuda":
            return f"fp16 needs a CUDA device (got {stage.device.type}): CPU half-precision kernels are missing or slow"
        return None

    def apply(self, stage: Stage) -> None:
        apply_precision(stage, torch.float16)
