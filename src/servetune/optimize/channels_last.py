"""``channels_last``: NHWC memory format for 2-D convolution weights and 4-D inputs; often faster convolutions
(oneDNN on CPU, tensor cores on CUDA). Outputs come back in the ordinary contiguous layout."""

from __future__ import annotations

import torch
from torch import nn

from servetune.optimize.base import Stage, Variant


def _has_conv2d(model: nn.Module) -> bool:
    # A TorchScript module's children are RecursiveScriptModules that keep the original class name.
    return any(isinstance(m, nn.Conv2d) or getattr(m, "original_name", "") == "Conv2d" for m in model.modules())


class ChannelsLast(Variant):
    name = "channels_last"
    kind = "layout"

    def check(self, stage: Stage) -> str | None:
        if not _has_conv2d(stage.source):
            return "the model has no 2-D convolution; channels_last only changes the layout of 4-D conv activations"
        return None

    def apply(self, stage: Stage) -> None:
        def to_channels_last(module: nn.Module) -> nn.Module:
            return module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

        stage.transforms.append(to_channels_last)
        stage.memory_format = torch.channels_last
