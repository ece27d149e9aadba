"""``image_classifier``: ImageNet-style classification, top-5 ``{label: probability}`` per image.

Labels come from ``index_to_name.json`` when the archive has one (else the class index as a string).
Images are converted to RGB first, so grey or RGBA uploads work with three-channel models.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from servetune.handlers.imaging import ImagenetPreprocess
from servetune.handlers.metrics import timed
from servetune.handlers.util import map_class_to_label
from servetune.handlers.vision import IMAGENET_MEAN, IMAGENET_STD, VisionHandler

__all__ = ["ImageClassifier"]


class ImageClassifier(VisionHandler):
    """Resize 256, centre-crop 224, normalise; softmax and the ``topk`` most likely classes."""

    topk = 5
    image_processing = ImagenetPreprocess(256, 224, IMAGENET_MEAN, IMAGENET_STD)  # no torchvision needed

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    @timed
    def postprocess(self, data: Any) -> list[dict[str, Any]]:
        probabilities = F.softmax(data, dim=1)
        probs, classes = torch.topk(probabilities, min(self.topk, probabilities.shape[1]), dim=1)
        return map_class_to_label(probs.tolist(), self.mapping, classes.tolist())
