"""``VisionHandler``: images in, one batched model call (``ts.torch_handler.vision_handler``).

Each request's ``data`` or ``body`` may be image bytes, a base64 string of them, or a nested list of
numbers. Undecodable inputs are rejected one by one (400) and the rest are stacked and run together.
"""

from __future__ import annotations

import base64
import binascii
import io
from abc import ABC
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from servetune.handlers.base import BaseHandler
from servetune.handlers.context import Context
from servetune.handlers.metrics import timed
from servetune.handlers.util import BadInputError, PredictionException, request_input

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "VisionHandler", "to_rgb"]

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


class VisionHandler(BaseHandler, ABC):
    """Base of the image handlers; subclasses set ``image_processing`` (PIL image -> tensor)."""

    image_processing: Callable[[Image.Image], torch.Tensor]

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        if not context.system_properties.get("limit_max_image_pixels"):
            Image.MAX_IMAGE_PIXELS = None  # process-wide, as in TorchServe

    def preprocess_item(self, row: Any) -> torch.Tensor:
        name = "data" if isinstance(row, dict) and row.get("data") else "body"
        image = request_input(row)
        if isinstance(image, str):
            try:
                image = base64.b64decode(image)
            except (binascii.Error, ValueError) as exc:
                raise BadInputError(f"{name} is text but not a base64-encoded image ({exc})") from exc
        if isinstance(image, (bytes, bytearray)):
            return self.image_processing(self.decode_image(name, bytes(image)))
        if isinstance(image, list):
            try:
                return torch.as_tensor(image, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise BadInputError(f"{name} is a list but not a nested list of numbers ({exc})") from exc
        kind = "missing" if image is None else f"a JSON {type(image).__name__}"
        raise BadInputError(f"{name} must be image bytes, a base64 string or a nested list of numbers, got {kind}")

    @staticmethod
    def decode_image(name: str, data: bytes) -> Image.Image:
        """Open and fully decode ``data``; any failure is the request's fault (``BadInputError``)."""
        if not data:
            raise BadInputError(f"{name} is empty")
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except Image.DecompressionBombError as exc:
            raise BadInputError(f"{name} is an image too large to decode ({exc})") from exc
        except UnidentifiedImageError as exc:
            raise BadInputError(f"{name} is not a decodable image (cannot identify image file)") from exc
        except (OSError, SyntaxError, ValueError) as exc:
            raise BadInputError(f"{name} is not a decodable image ({exc})") from exc
        return image

    @timed
    def preprocess(self, data: list[Any]) -> Any:
        images = self.preprocess_each(data, self.preprocess_item)
        return torch.stack(images).to(self.device) if images else None

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any = 0) -> Any:
        try:
            from captum.attr import IntegratedGradients
        except ImportError:
            raise PredictionException("explanations need captum (pip install captum)", 501) from None
        return IntegratedGradients(self.model).attribute(tensor_data, target=target, n_steps=15).tolist()


def to_rgb(image: Image.Image) -> Image.Image:
    """Grey, palette and RGBA images to the three channels ImageNet-style models expect."""
    return image if image.mode == "RGB" else image.convert("RGB")
