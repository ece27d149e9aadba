"""ResNet-18 (torchvision), the architecture the archive's state_dict is loaded into."""

from __future__ import annotations

from torchvision.models.resnet import BasicBlock, ResNet


class ResNet18(ResNet):
    def __init__(self) -> None:
        super().__init__(BasicBlock, [2, 2, 2, 2])
