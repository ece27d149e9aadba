"""``image_segmenter``: per image, the most likely class and its probability for every pixel.

The model output is a tensor ``[N, K, H, W]`` or torchvision's ``{"out": tensor}``; each image's answer
is a ``H x W x 2`` nested list of ``[class, probability]`` (as TorchServe, to keep responses small).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from servetune.handlers.imaging import ImagenetPreprocess
from servetune.handlers.metrics import timed
from servetune.handlers.vision import IMAGENET_MEAN, IMAGENET_STD, VisionHandler

__all__ = ["ImageSegmenter"]


class ImageSegmenter(VisionHandler):
    image_processing = ImagenetPreprocess(256, 224, IMAGENET_MEAN, IMAGENET_STD)  # no torchvision needed

    @timed
    def postprocess(self, data: Any) -> list[Any]:
        logits = data["out"] if isinstance(data, Mapping) else data
        best = torch.max(torch.nn.functional.softmax(logits, dim=1), dim=1)
        return torch.stack([best.indices.to(best.values.dtype), best.values], dim=3).tolist()
