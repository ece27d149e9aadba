"""The drawn-humanoid detector's architecture: torchvision Mask R-CNN, ResNet-50-FPN, one foreground class.

Built exactly as ``maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=2)`` builds it (same
modules, created in the same order, so the same seed gives the same weights), but as a class with a no-argument
constructor, which is what an eager-mode archive needs. Nothing is downloaded.

Serving-time settings (input size, proposal and detection counts) are plain attributes of torchvision's modules;
the handler sets them from model-config.yaml after loading the weights (see :func:`configure`), so one set of
weights serves every input size.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

#: label 1 of the two classes (0 is the background)
CLASS_NAMES = {1: "drawn_humanoid"}

#: model-config.yaml ``detector:`` keys and their defaults (see docs/animated-drawings.md)
DEFAULTS: dict[str, Any] = {
    "min_size": 800,  # torchvision's default: the shorter side is resized to this ...
    "max_size": 1333,  # ... unless the longer side would exceed this
    "detections_per_img": 10,  # a fixed cap: with score threshold 0 every image costs the same
    "rpn_pre_nms_top_n": 1000,  # torchvision's test-time defaults
    "rpn_post_nms_top_n": 1000,
}


class DrawnHumanoidDetector(MaskRCNN):  # type: ignore[misc]  # torchvision is untyped
    """Mask R-CNN ResNet-50-FPN with two classes (background, drawn humanoid); random weights until loaded."""

    def __init__(self) -> None:
        # maskrcnn_resnet50_fpn without weights: BatchNorm2d, all five backbone stages trainable
        backbone = resnet_fpn_backbone(
            backbone_name="resnet50", weights=None, norm_layer=nn.BatchNorm2d, trainable_layers=5
        )
        super().__init__(
            backbone,
            num_classes=2,
            min_size=DEFAULTS["min_size"],
            max_size=DEFAULTS["max_size"],
            box_score_thresh=0.0,
            box_detections_per_img=DEFAULTS["detections_per_img"],
        )


def configure(model: MaskRCNN, settings: dict[str, Any]) -> None:
    """Apply the serving-time settings of :data:`DEFAULTS` (already validated) to a loaded model.

    Box score threshold 0 and a fixed detection cap make every image cost the same whatever the weights:
    random weights would otherwise return the cap of 100 boxes, a trained model a few.
    """
    model.transform.min_size = (int(settings["min_size"]),)
    model.transform.max_size = int(settings["max_size"])
    model.roi_heads.score_thresh = 0.0
    model.roi_heads.detections_per_img = int(settings["detections_per_img"])
    model.rpn._pre_nms_top_n["testing"] = int(settings["rpn_pre_nms_top_n"])
    model.rpn._post_nms_top_n["testing"] = int(settings["rpn_post_nms_top_n"])
