"""Sample inputs for models whose real inputs servetune does not have: random images of a known shape."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from servetune._exceptions import ConfigError
from servetune.optimize._tree import ModelInputs

DEFAULT_INPUT_SHAPE = (3, 224, 224)


def is_detector(model: nn.Module) -> bool:
    """True for torchvision detection models (Faster/Mask/Keypoint R-CNN), which take a list of images."""
    return any(cls.__name__ == "GeneralizedRCNN" for cls in type(model).__mro__)


def sample_inputs(
    model: nn.Module,
    input_shape: tuple[int, ...] = DEFAULT_INPUT_SHAPE,
    batch: int = 2,
    device: torch.device | None = None,
) -> ModelInputs:
    """Random inputs in [0, 1) for one call of ``model``: a ``(batch, *input_shape)`` tensor, or for torchvision
    detectors a list of ``batch`` images. Seeded by ``batch``: the same call gives the same inputs."""
    generator = torch.Generator().manual_seed(batch)
    images = torch.rand((batch, *input_shape), generator=generator).to(device or torch.device("cpu"))
    return (list(images),) if is_detector(model) else (images,)


def config_input_shape(config: dict[str, Any]) -> tuple[int, ...]:
    """``input_shape`` from a model-config.yaml mapping (without the batch dimension), else 3x224x224."""
    shape = config.get("input_shape")
    if shape is None:
        return DEFAULT_INPUT_SHAPE
    if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ConfigError(
            f"model-config.yaml input_shape={shape!r}: expected a list of positive ints, e.g. [3, 224, 224]"
        )
    return tuple(shape)
