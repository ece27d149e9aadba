"""The drawn-humanoid pose estimator's architecture: a top-down heatmap model (SimpleBaseline style).

ResNet-50 backbone (torchvision's, without its pooling and classifier) -> three 4x4 stride-2 transposed
convolutions with 256 channels, BatchNorm and ReLU -> a 1x1 convolution to 17 heatmaps, one per COCO keypoint.
A 256x192 (h x w) input gives 64x48 heatmaps (stride 4). Parameter names follow the usual SimpleBaseline layout
(``backbone.*``, ``keypoint_head.deconv_layers.*``, ``keypoint_head.final_layer.*``), so a checkpoint saved in
that layout loads as a state_dict. Random weights until loaded; nothing is downloaded.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from torchvision.models import resnet50

#: network input, (height, width): the crop is resized (aspect kept, padded) to this
INPUT_SIZE = (256, 192)
#: heatmap size, (height, width)
HEATMAP_SIZE = (64, 48)

#: COCO keypoint order, which the Animated Drawings app indexes by position
KEYPOINT_NAMES = (
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
)


class DrawnHumanoidPoseEstimator(nn.Module):
    """``(N, 3, 256, 192)`` normalised RGB crops -> ``(N, 17, 64, 48)`` keypoint heatmaps."""

    def __init__(self, num_keypoints: int = len(KEYPOINT_NAMES), deconv_channels: int = 256) -> None:
        super().__init__()
        resnet = resnet50(weights=None)
        self.backbone = nn.Sequential(
            OrderedDict((name, getattr(resnet, name)) for name in ("conv1", "bn1", "relu", "maxpool"))
            | OrderedDict((f"layer{i}", getattr(resnet, f"layer{i}")) for i in range(1, 5))
        )
        layers: list[nn.Module] = []
        channels = 2048
        for _ in range(3):
            layers += [
                nn.ConvTranspose2d(channels, deconv_channels, 4, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(deconv_channels),
                nn.ReLU(inplace=True),
            ]
            channels = deconv_channels
        self.keypoint_head = nn.ModuleDict(
            {"deconv_layers": nn.Sequential(*layers), "final_layer": nn.Conv2d(deconv_channels, num_keypoints, 1)}
        )
        # PyTorch's default initialisation, not SimpleBaseline's std=0.001: with random weights that gives
        # heatmaps near 1e-5, below half precision's normal range (trained heatmaps peak near 1).

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.backbone(images)
        heatmaps: torch.Tensor = self.keypoint_head["final_layer"](self.keypoint_head["deconv_layers"](features))
        return heatmaps
