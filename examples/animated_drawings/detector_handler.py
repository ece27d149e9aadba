"""Handler of ``drawn_humanoid_detector``: an image in, the Animated Drawings app's detection list out.

Per request: ``[{"class_name": "drawn_humanoid", "bbox": [x1, y1, x2, y2], "score": s}, ...]`` in the uploaded
image's pixel coordinates, best first, every detection scoring at least ``score_threshold``. A batch is one model
call: Mask R-CNN takes a list of images, so sizes may differ within a batch. A request whose body is not a
decodable image is answered 400 alone; the rest of its batch is served.

model-config.yaml, section ``detector:`` (defaults in ``detector_model.DEFAULTS``): ``min_size``/``max_size``
(torchvision resizes the shorter side to ``min_size`` unless the longer would pass ``max_size``),
``detections_per_img``, ``rpn_pre_nms_top_n``/``rpn_post_nms_top_n``, ``score_threshold`` (default 0) and
``weights`` (a trained state_dict; without it the archive's seeded random weights are served).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ad_common
import detector_model
import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from servetune.handlers.metrics import timed
from servetune.handlers.vision import VisionHandler, to_rgb

SETTINGS_DEFAULTS: dict[str, Any] = {**detector_model.DEFAULTS, "score_threshold": 0.0}


class DrawnHumanoidDetectorHandler(VisionHandler):
    """Mask R-CNN drawn-humanoid detector, batched, answering in the Animated Drawings app's format."""

    def __init__(self) -> None:
        super().__init__()
        self.settings: dict[str, Any] = {}
        self.weights: dict[str, Any] = {}

    @staticmethod
    def image_processing(image: Image.Image) -> torch.Tensor:
        """RGB float image in [0, 1]; Mask R-CNN normalises and resizes it itself."""
        tensor: torch.Tensor = pil_to_tensor(to_rgb(image)).float().div_(255.0)
        return tensor

    def _load_model(self, model_dir: Path, model_file: str, model_pt_path: str | None) -> Any:
        self.settings = ad_common.read_settings(self.model_yaml_config, "detector", SETTINGS_DEFAULTS)
        path = ad_common.weights_file(self.settings, model_dir, model_pt_path)
        model = detector_model.DrawnHumanoidDetector()
        ad_common.load_weights(model, path)
        detector_model.configure(model, self.settings)
        self.weights = ad_common.weights_provenance(path, model_dir, configured=bool(self.settings["weights"]))
        return model.to(self.device).eval()

    @timed
    def preprocess(self, data: list[Any]) -> Any:
        images = self.preprocess_each(data, self.preprocess_item)
        dtype = ad_common.input_dtype(self.model)
        return [image.to(self.device, dtype) for image in images] if images else None

    @timed
    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        if isinstance(data, tuple) and len(data) == 2 and isinstance(data[1], list):
            data = data[1]  # a scripted detector returns (losses, detections)
        threshold = float(self.settings["score_threshold"])
        names = self.mapping or {}
        results = []
        for detections in data:
            scores = detections["scores"].float()
            order = torch.argsort(scores, descending=True)
            keep = order[scores[order] >= threshold]
            boxes = detections["boxes"][keep].float().tolist()
            labels = detections["labels"][keep].tolist()
            results.append(
                [
                    {
                        "class_name": names.get(str(label)) or detector_model.CLASS_NAMES.get(label, str(label)),
                        "bbox": box,
                        "score": score,
                    }
                    for box, label, score in zip(boxes, labels, scores[keep].tolist(), strict=True)
                ]
            )
        return results

    def describe_handle(self) -> dict[str, Any]:
        return {
            "model": "Mask R-CNN ResNet-50-FPN (torchvision), classes: background, drawn_humanoid",
            "weights": self.weights,
            "settings": {k: v for k, v in self.settings.items() if k != "weights"},
            "device": str(self.device),
            "optimization": getattr(self, "optimization", "eager"),
            "output": 'per image: [{"class_name", "bbox": [x1, y1, x2, y2], "score"}], best first',
        }
