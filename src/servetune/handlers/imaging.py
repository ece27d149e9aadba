"""The image preprocessing of the built-in vision handlers, without torchvision.

``torchvision.transforms`` on a PIL image is PIL's own resize and crop, then ``ToTensor`` and ``Normalize``; importing
torchvision for that costs a worker as much time as importing torch itself and ~90 MB of private memory (its
operators, models and datasets load with the package). These do the same steps, with the same arithmetic, so a
model served by ``image_classifier`` or ``image_segmenter`` gets the same tensors whether or not torchvision is
installed (tests/test_handlers_vision.py compares them with torchvision's). A handler that wants torchvision's
transforms still imports them itself and sets ``image_processing``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

__all__ = ["ImagenetPreprocess", "pil_to_tensor"]


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """``transforms.ToTensor()`` of an 8-bit image: C x H x W float32 in [0, 1]."""
    array = np.array(image, np.uint8, copy=True)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous().to(dtype=torch.get_default_dtype()).div(255)


def _resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """``transforms.Resize(size)``'s output (width, height): the shorter side to ``size``, the aspect kept (floor)."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


class ImagenetPreprocess:
    """RGB, ``Resize(resize)`` (bilinear, PIL's antialiasing), ``CenterCrop(crop)``, ``ToTensor``, ``Normalize``."""

    def __init__(self, resize: int, crop: int, mean: Sequence[float], std: Sequence[float]) -> None:
        self.resize = resize
        self.crop = crop
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        if image.mode != "RGB":
            image = image.convert("RGB")
        size = _resized_size(image.width, image.height, self.resize)
        if size != (image.width, image.height):
            image = image.resize(size, Image.Resampling.BILINEAR)
        image = self._center_crop(image)
        return (pil_to_tensor(image) - self.mean) / self.std

    def _center_crop(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        crop = self.crop
        if crop > width or crop > height:  # torchvision pads with zeros first, then crops
            padded = Image.new(image.mode, (max(width, crop), max(height, crop)))
            left, top = (max(crop - width, 0)) // 2, (max(crop - height, 0)) // 2
            padded.paste(image, (left, top))
            image, (width, height) = padded, padded.size
        top, left = int(round((height - crop) / 2.0)), int(round((width - crop) / 2.0))
        return image.crop((left, top, left + crop, top + crop))

    def __repr__(self) -> str:
        return f"ImagenetPreprocess(resize={self.resize}, crop={self.crop})"
