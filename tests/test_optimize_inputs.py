"""Sample inputs: a batch tensor for ordinary models, a list of images for torchvision detectors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from servetune import ConfigError
from servetune.optimize import config_input_shape, sample_inputs


def test_sample_inputs_are_a_seeded_batch_tensor() -> None:
    (batch,) = sample_inputs(nn.Linear(2, 2), (3, 8, 8), batch=4)
    assert batch.shape == (4, 3, 8, 8) and batch.dtype == torch.float32
    assert 0.0 <= float(batch.min()) and float(batch.max()) < 1.0
    assert torch.equal(batch, sample_inputs(nn.Linear(2, 2), (3, 8, 8), batch=4)[0])


def test_a_torchvision_detector_gets_a_list_of_images() -> None:
    from torchvision.models.detection import FasterRCNN

    backbone = nn.Conv2d(3, 4, 3)
    backbone.out_channels = 4  # type: ignore[assignment]
    detector = FasterRCNN(backbone, num_classes=2)
    (images,) = sample_inputs(detector, (3, 32, 32), batch=3)
    assert isinstance(images, list) and len(images) == 3 and images[0].shape == (3, 32, 32)


def test_config_input_shape() -> None:
    assert config_input_shape({}) == (3, 224, 224)
    assert config_input_shape({"input_shape": [16]}) == (16,)
    for bad in ([], [3, 0], "3x224x224", [3.0, 224, 224]):
        with pytest.raises(ConfigError, match="input_shape"):
            config_input_shape({"input_shape": bad})
