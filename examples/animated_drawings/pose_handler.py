"""Handler of ``drawn_humanoid_pose_estimator``: a crop of one drawn figure in, exactly one skeleton out.

Per request: ``[{"keypoints": [[x, y, score], ...]}]``, one list entry, 17 keypoints in COCO order, ``x, y`` in
the uploaded crop's pixel coordinates, as the Animated Drawings app expects. Top-down, as mmpose does it: the whole
crop is the person box, widened to the network's 3:4 aspect and by ``padding`` (1.25), warped to 192x256; each
heatmap's argmax, shifted a quarter pixel towards its higher neighbour, is mapped back, its value is the score.
A batch is one model call on the stacked crops; an undecodable image is answered 400 alone.

model-config.yaml, section ``pose:``: ``padding`` and ``weights`` (a trained state_dict; without it the
archive's seeded random weights are served). An archive whose serialized file is a ``.pt2`` (the estimator exported
or AOTInductor-compiled by ``servetune optimize --write``) serves that package as it is.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

import ad_common
import pose_model
import torch
from PIL import Image
from torchvision.transforms.functional import normalize, pil_to_tensor

from servetune.handlers.metrics import timed
from servetune.handlers.util import BadInputError, request_input
from servetune.handlers.vision import IMAGENET_MEAN, IMAGENET_STD, VisionHandler, to_rgb

SETTINGS_DEFAULTS: dict[str, Any] = {"padding": 1.25}

Box = tuple[float, float, float, float]  # x0, y0, width, height of the warped region, in crop pixels


class DrawnHumanoidPoseHandler(VisionHandler):
    """SimpleBaseline-style pose estimator, batched, answering in the Animated Drawings app's format."""

    def __init__(self) -> None:
        super().__init__()
        self.settings: dict[str, Any] = {}
        self.weights: dict[str, Any] = {}
        self.boxes: list[Box] = []

    def _load_model(self, model_dir: Path, model_file: str, model_pt_path: str | None) -> Any:
        self.settings = ad_common.read_settings(self.model_yaml_config, "pose", SETTINGS_DEFAULTS)
        if model_pt_path is not None and model_pt_path.endswith(".pt2") and not self.settings["weights"]:
            # an exported or AOTInductor-compiled estimator (servetune optimize --variants aoti --write): the
            # package is the whole model, loaded by extension as the built-in handlers load it
            self.weights = ad_common.weights_provenance(Path(model_pt_path), model_dir, configured=False)
            return self._load_pt2(model_pt_path)
        path = ad_common.weights_file(self.settings, model_dir, model_pt_path)
        model = pose_model.DrawnHumanoidPoseEstimator()
        ad_common.load_weights(model, path)
        self.weights = ad_common.weights_provenance(path, model_dir, configured=bool(self.settings["weights"]))
        return model.to(self.device).eval()

    def warp_item(self, row: Any) -> tuple[torch.Tensor, Box]:
        """One request's crop as a normalised 3x256x192 tensor, and the region of the crop it shows."""
        name = "data" if isinstance(row, dict) and row.get("data") else "body"
        value = request_input(row)
        if isinstance(value, str):  # base64 text, as the built-in vision handlers accept
            try:
                value = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise BadInputError(f"{name} is text but not a base64-encoded image ({exc})") from exc
        if not isinstance(value, (bytes, bytearray)):
            raise BadInputError(f"{name} must be image bytes (a PNG or JPEG of the cropped figure)")
        image = to_rgb(self.decode_image(name, bytes(value)))
        box = warp_region(image.width, image.height, float(self.settings["padding"]))
        x0, y0, width, height = box
        out_h, out_w = pose_model.INPUT_SIZE
        warped = image.transform(
            (out_w, out_h), Image.Transform.EXTENT, (x0, y0, x0 + width, y0 + height), Image.Resampling.BILINEAR
        )
        tensor = normalize(pil_to_tensor(warped).float().div_(255.0), IMAGENET_MEAN, IMAGENET_STD)
        return tensor, box

    @timed
    def preprocess(self, data: list[Any]) -> Any:
        items = self.preprocess_each(data, self.warp_item)
        self.boxes = [box for _, box in items]
        if not items:
            return None
        return torch.stack([tensor for tensor, _ in items]).to(self.device, ad_common.input_dtype(self.model))

    @timed
    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        heatmaps = data.float()
        xs, ys, scores = decode_heatmaps(heatmaps)
        out_h, out_w = heatmaps.shape[-2:]
        results = []
        for i, (x0, y0, width, height) in enumerate(self.boxes):
            px = (xs[i] * (width / out_w) + x0).tolist()
            py = (ys[i] * (height / out_h) + y0).tolist()
            keypoints = [[x, y, s] for x, y, s in zip(px, py, scores[i].tolist(), strict=True)]
            results.append([{"keypoints": keypoints}])
        return results

    def describe_handle(self) -> dict[str, Any]:
        return {
            "model": "top-down heatmap pose estimator: ResNet-50 + 3 deconvolutions (SimpleBaseline), "
            "input 192x256 (w x h), heatmaps 48x64, 17 COCO keypoints",
            "weights": self.weights,
            "settings": {k: v for k, v in self.settings.items() if k != "weights"},
            "device": str(self.device),
            "optimization": getattr(self, "optimization", "eager"),
            "loaded": self.loaded_model(),
            "output": 'per image: [{"keypoints": [[x, y, score] x 17]}] (COCO order, crop pixels)',
        }


def warp_region(width: int, height: int, padding: float) -> Box:
    """The region of a ``width`` x ``height`` crop warped to the input: centred, 3:4, ``padding`` times larger."""
    out_h, out_w = pose_model.INPUT_SIZE
    aspect = out_w / out_h
    box_w, box_h = float(width), float(height)
    if box_w > aspect * box_h:
        box_h = box_w / aspect
    else:
        box_w = box_h * aspect
    box_w, box_h = box_w * padding, box_h * padding
    return (width - box_w) / 2.0, (height - box_h) / 2.0, box_w, box_h


def decode_heatmaps(heatmaps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(N, K, H, W)`` heatmaps -> x, y (heatmap pixels, quarter-pixel refined) and score, each ``(N, K)``."""
    n, k, h, w = heatmaps.shape
    flat = heatmaps.reshape(n, k, h * w)
    scores, index = flat.max(dim=2)
    xi, yi = index % w, torch.div(index, w, rounding_mode="floor")

    def step(offset: int, interior: torch.Tensor) -> torch.Tensor:
        """sign(next - previous) along one axis where both neighbours exist, else 0."""
        after = flat.gather(2, (index + offset).clamp(0, h * w - 1).unsqueeze(2)).squeeze(2)
        before = flat.gather(2, (index - offset).clamp(0, h * w - 1).unsqueeze(2)).squeeze(2)
        return torch.where(interior, torch.sign(after - before), torch.zeros_like(scores))

    dx = step(1, (xi > 0) & (xi < w - 1))
    dy = step(w, (yi > 0) & (yi < h - 1))
    xs = xi.float() + 0.25 * dx
    ys = yi.float() + 0.25 * dy
    return xs, ys, scores
