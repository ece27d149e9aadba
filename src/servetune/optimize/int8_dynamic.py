"""``int8-dynamic``: dynamic int8 quantization of Linear and LSTM layers (weights int8, activations quantized
on the fly), CPU only. Convolutions stay fp32, so CNNs gain little; transformer and MLP heads gain most.

It uses ``torch.ao.quantization.quantize_dynamic``, which PyTorch marks deprecated in favour of torchao.
"""

from __future__ import annotations

from torch import nn

from servetune.optimize.base import Stage, Variant
from servetune.optimize.parity import Tolerance

_QUANTIZABLE: tuple[type[nn.Module], ...] = (nn.Linear, nn.LSTM)


class Int8Dynamic(Variant):
    name = "int8-dynamic"
    kind = "precision"
    tolerance = Tolerance(atol=1e-2, rtol=5e-2, min_top1=0.8, min_box_iou=0.9, max_score_diff=0.05, min_match=0.9)

    def check(self, stage: Stage) -> str | None:
        if stage.device.type != "cpu":
            return f"dynamic int8 kernels run on CPU only (got {stage.device.type})"
        if hasattr(stage.source, "graph"):
            return "a TorchScript model cannot be quantized here; quantize the eager model"
        if not any(isinstance(m, _QUANTIZABLE) for m in stage.source.modules()):
            return "the model has no Linear or LSTM layer to quantize"
        return None

    def apply(self, stage: Stage) -> None:
        from torch.ao.quantization import quantize_dynamic

        def quantize(module: nn.Module) -> nn.Module:
            quantized: nn.Module = quantize_dynamic(  # type: ignore[no-untyped-call]
                module, set(_QUANTIZABLE), inplace=True
            )
            return quantized

        stage.transforms.append(quantize)
