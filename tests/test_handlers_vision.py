"""The image handlers (image_classifier, object_detector, image_segmenter) on tiny random-weight models."""

from __future__ import annotations

import base64
import io
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from servetune.handlers import InputParam, Request, Service, load_service, uninstall_ts_alias
from servetune.handlers.image_classifier import ImageClassifier

CLASSIFIER_SOURCE = """
import torch

CALLS = []

class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, stride=4)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(4, 7)

    def forward(self, x):
        CALLS.append(x.shape[0])
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))
"""

DETECTOR_SOURCE = """
import torch

class TinyDetector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, images):
        out = []
        for image in images:
            h, w = image.shape[-2:]
            boxes = torch.tensor([[0.0, 0.0, w / 2, h / 2], [1.0, 2.0, w, h], [0.0, 0.0, 1.0, 1.0]]) * self.scale
            scores = torch.tensor([0.9, 0.5, 0.1]) + 0 * image.mean()
            out.append({"boxes": boxes, "labels": torch.tensor([1, 2, 3]), "scores": scores})
        return out
"""

SEGMENTER_SOURCE = """
import torch

class TinySegmenter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Conv2d(3, 3, kernel_size=1)

    def forward(self, x):
        return {"out": self.head(x)}
"""


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # load_service puts the model dir on sys.path and installs the ts alias: undo both for other tests
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    uninstall_ts_alias()


def image_bytes(size: tuple[int, int] = (40, 30), mode: str = "RGB", fmt: str = "PNG", seed: int = 0) -> bytes:
    rng = random.Random(seed)
    channels = len(mode)
    raw = bytes(rng.randrange(256) for _ in range(size[0] * size[1] * channels))
    buffer = io.BytesIO()
    Image.frombytes(mode, size, raw).save(buffer, fmt)
    return buffer.getvalue()


def model_dir(tmp_path: Path, source: str, class_name: str, labels: dict[str, Any] | None = None) -> Path:
    (tmp_path / "model.py").write_text(source)
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    torch.manual_seed(0)
    torch.save(namespace[class_name]().state_dict(), tmp_path / "weights.pth")
    if labels is not None:
        (tmp_path / "index_to_name.json").write_text(json.dumps(labels))
    return tmp_path


def load(directory: Path, handler: str, **kwargs: Any) -> Service:
    manifest = {
        "model": {
            "modelName": "m",
            "modelVersion": "1",
            "handler": handler,
            "serializedFile": "weights.pth",
            "modelFile": "model.py",
        }
    }
    return load_service(
        model_dir=directory,
        manifest=manifest,
        model_name="m",
        gpu_id=None,
        batch_size=8,
        model_yaml_config={},
        **kwargs,
    )


def image_request(data: bytes, request_id: str = "r", name: str = "data", content_type: str = "image/png") -> Request:
    return Request(request_id, {}, [InputParam(name, content_type, data)])


LABELS = {str(i): ["n0", f"class{i}"] for i in range(7)}


def expected_top5(data: bytes) -> dict[str, float]:
    namespace: dict[str, Any] = {}
    exec(CLASSIFIER_SOURCE, namespace)
    torch.manual_seed(0)
    net = namespace["TinyNet"]().eval()
    tensor = ImageClassifier.image_processing(Image.open(io.BytesIO(data)))
    with torch.no_grad():
        probs = torch.softmax(net(tensor.unsqueeze(0)), dim=1)[0]
    top = torch.topk(probs, 5)
    return {f"class{int(c)}": float(p) for p, c in zip(top.values, top.indices, strict=True)}


def assert_top5(body: bytes, data: bytes) -> None:
    got = json.loads(body)
    want = expected_top5(data)
    assert list(got) == list(want)
    assert got == pytest.approx(want, rel=1e-5)


def test_image_classifier_top5_labels_one_model_call(tmp_path: Path) -> None:
    service = load(model_dir(tmp_path, CLASSIFIER_SOURCE, "TinyNet", LABELS), "image_classifier")
    images = [image_bytes(seed=1), image_bytes((64, 48), fmt="JPEG", seed=2)]
    out = service.predict([image_request(images[0], "a"), image_request(images[1], "b", name="body")])
    assert [r.status for r in out] == [200, 200]
    assert all(r.content_type == "application/json" for r in out)
    for response, data in zip(out, images, strict=True):
        assert_top5(response.body, data)
    assert sys.modules["model"].CALLS == [2]


def test_corrupt_image_fails_only_itself(tmp_path: Path) -> None:
    service = load(model_dir(tmp_path, CLASSIFIER_SOURCE, "TinyNet", LABELS), "image_classifier")
    good = [image_bytes(seed=3), image_bytes(seed=4)]
    out = service.predict(
        [image_request(good[0], "r0"), image_request(b"not an image at all", "r1"), image_request(good[1], "r2")]
    )
    assert [r.status for r in out] == [200, 400, 200]
    assert json.loads(out[1].body) == {
        "code": 400,
        "type": "BadRequestException",
        "message": "request r1: data is not a decodable image (cannot identify image file)",
    }
    assert out[1].reason == "Bad Request"
    assert_top5(out[0].body, good[0])
    assert_top5(out[2].body, good[1])
    assert sys.modules["model"].CALLS == [2]  # the good images still ran together, once


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (image_request(image_bytes()[:60]), "data is not a decodable image"),
        (image_request(b"", name="body"), "body is empty"),
        (
            Request("r", {}, [InputParam("body", "application/json", b'{"image": 1}')]),
            "body must be image bytes, a base64 string or a nested list of numbers, got a JSON dict",
        ),
        (Request("r", {}, []), "got missing"),
    ],
)
def test_bad_images_are_400(tmp_path: Path, request_: Request, message: str) -> None:
    service = load(model_dir(tmp_path, CLASSIFIER_SOURCE, "TinyNet"), "image_classifier")
    (out,) = service.predict([request_])
    assert out.status == 400
    assert message in json.loads(out.body)["message"]


def test_base64_grey_and_nested_list_inputs(tmp_path: Path) -> None:
    service = load(model_dir(tmp_path, CLASSIFIER_SOURCE, "TinyNet", LABELS), "image_classifier")
    colour = image_bytes(seed=5)
    as_text = Request("t", {}, [InputParam("body", "text/plain", base64.b64encode(colour))])
    grey = image_request(image_bytes(mode="L", seed=6))
    out = service.predict([as_text, grey])
    assert [r.status for r in out] == [200, 200]
    assert_top5(out[0].body, colour)
    nested = Request(
        "n", {}, [InputParam("body", "application/json", json.dumps(torch.zeros(3, 8, 8).tolist()).encode())]
    )
    (listed,) = service.predict([nested])
    assert listed.status == 200 and len(json.loads(listed.body)) == 5


def test_image_pixel_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    directory = model_dir(tmp_path, CLASSIFIER_SOURCE, "TinyNet")
    (out,) = load(directory, "image_classifier").predict([image_request(image_bytes((32, 32)))])
    assert out.status == 400 and "too large" in json.loads(out.body)["message"]
    load(directory, "image_classifier", limit_max_image_pixels=False)
    assert Image.MAX_IMAGE_PIXELS is None


def test_object_detector_boxes_above_threshold_mixed_sizes(tmp_path: Path) -> None:
    labels = {"1": "cat", "2": "dog", "3": "bird"}
    service = load(model_dir(tmp_path, DETECTOR_SOURCE, "TinyDetector", labels), "object_detector")
    out = service.predict([image_request(image_bytes((40, 30))), image_request(image_bytes((20, 10)))])
    assert [r.status for r in out] == [200, 200]
    assert json.loads(out[0].body) == [
        {"cat": [0.0, 0.0, 20.0, 15.0], "score": pytest.approx(0.9)},
        {"dog": [1.0, 2.0, 40.0, 30.0], "score": pytest.approx(0.5)},
    ]
    assert json.loads(out[1].body)[0] == {"cat": [0.0, 0.0, 10.0, 5.0], "score": pytest.approx(0.9)}


def test_image_segmenter_class_and_probability_per_pixel(tmp_path: Path) -> None:
    service = load(model_dir(tmp_path, SEGMENTER_SOURCE, "TinySegmenter"), "image_segmenter")
    out = service.predict([image_request(image_bytes(seed=7)), image_request(b"\x00\x01")])
    assert [r.status for r in out] == [200, 400]
    mask = torch.tensor(json.loads(out[0].body))
    assert mask.shape == (224, 224, 2)
    classes, probs = mask[..., 0], mask[..., 1]
    assert set(classes.unique().tolist()) <= {0.0, 1.0, 2.0}
    assert bool(((probs > 1 / 3 - 1e-6) & (probs <= 1.0)).all())


@pytest.mark.parametrize(
    ("size", "mode"),
    [
        ((320, 240), "RGB"),
        ((240, 320), "RGB"),
        ((256, 256), "RGB"),
        ((300, 257), "L"),
        ((100, 60), "RGBA"),
        ((1000, 20), "P"),
    ],
)
def test_the_classifier_preprocessing_is_torchvisions_without_torchvision(size: tuple[int, int], mode: str) -> None:
    # servetune's image_classifier and image_segmenter do not import torchvision (a worker saves its import time and
    # ~90 MB); their tensors must still be exactly what torchvision's transforms give
    from torchvision import transforms

    from servetune.handlers.vision import IMAGENET_MEAN, IMAGENET_STD, to_rgb

    rng = random.Random(hash((size, mode)) & 0xFFFF)
    image = Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3)))
    image = image.convert(mode)
    reference = transforms.Compose(
        [
            transforms.Lambda(to_rgb),
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
        ]
    )
    expected = reference(image)
    got = ImageClassifier.image_processing(image)
    assert got.shape == expected.shape == (3, 224, 224) and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_the_image_handlers_import_no_torchvision() -> None:
    import subprocess

    code = (
        "import sys; import servetune.handlers.image_classifier, servetune.handlers.image_segmenter; "
        "print('torchvision' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
