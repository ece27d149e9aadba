"""``object_detector``: per image, a list of ``{<label>: [x1, y1, x2, y2], "score": s}`` above ``threshold``.

The model receives a list of image tensors (torchvision detection models' input, images may differ in
size) in one call and returns one ``{"boxes", "labels", "scores"}`` dict per image; a scripted model's
``(losses, detections)`` tuple is accepted too.
"""

from __future__ import annotations

from typing import Any

from torchvision import transforms

from servetune.handlers.metrics import timed
from servetune.handlers.util import map_class_to_label
from servetune.handlers.vision import VisionHandler

__all__ = ["ObjectDetector"]


class ObjectDetector(VisionHandler):
    image_processing = transforms.Compose([transforms.ToTensor()])
    threshold = 0.5

    @timed
    def preprocess(self, data: list[Any]) -> Any:
        images = self.preprocess_each(data, self.preprocess_item)
        return [image.to(self.device) for image in images] if images else None

    @timed
    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        if isinstance(data, tuple) and len(data) == 2 and isinstance(data[1], list):
            data = data[1]  # TorchScript detection models return (losses, detections)
        result = []
        for detections in data:
            keep = detections["scores"] >= self.threshold
            boxes = detections["boxes"][keep].tolist()
            labels = detections["labels"][keep].tolist()
            scores = detections["scores"][keep].tolist()
            found = []
            for label, box, score in zip(labels, boxes, scores, strict=True):
                entry = map_class_to_label([[box]], self.mapping, [[label]])[0]
                entry["score"] = score
                found.append(entry)
            result.append(found)
        return result
