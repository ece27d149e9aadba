"""The model every peer serves, as each peer's own app calls it (runs inside the peer's venv; torch only for resnet18).

The environment says what to serve: PEER_MODEL (``noop`` or ``resnet18``), PEER_ASSETS (a folder with ``model.py``,
``resnet18.pt`` and ``index_to_name.json``), PEER_PORT, PEER_WORKERS, PEER_BATCH, PEER_DELAY_MS. The resnet18 pipeline
is TorchServe's image_classifier's (servetune's built-in one does the same): PIL decode, Resize 256, CenterCrop 224,
normalise, forward, softmax, top-5 labels; one torch thread per worker.
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
from typing import Any

MODEL = os.environ.get("PEER_MODEL", "noop")
PORT = int(os.environ.get("PEER_PORT", "8000"))
WORKERS = int(os.environ.get("PEER_WORKERS", "1"))
BATCH = int(os.environ.get("PEER_BATCH", "8"))
DELAY_MS = float(os.environ.get("PEER_DELAY_MS", "10"))
ASSETS = os.environ.get("PEER_ASSETS", "")


class Model:
    """``predict(list of request bodies) -> list of JSON-able answers``; bodies are bytes, or base64 text."""

    def __init__(self) -> None:
        self.resnet = MODEL == "resnet18"
        if not self.resnet:
            return
        import torch
        from torchvision import transforms

        torch.set_num_threads(1)
        sys.path.insert(0, ASSETS)
        from model import ResNet18

        self.torch = torch
        self.model = ResNet18().eval()
        weights = torch.load(os.path.join(ASSETS, "resnet18.pt"), map_location="cpu", weights_only=True)
        self.model.load_state_dict(weights)
        with open(os.path.join(ASSETS, "index_to_name.json")) as fh:
            self.labels = json.load(fh)
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        self.transform = transforms.Compose(
            [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]
        )

    def predict(self, bodies: list[Any]) -> list[Any]:
        if not self.resnet:
            return ["OK"] * len(bodies)
        from PIL import Image

        torch = self.torch
        images = [self.transform(Image.open(io.BytesIO(as_bytes(b))).convert("RGB")) for b in bodies]
        with torch.inference_mode():
            probs = torch.softmax(self.model(torch.stack(images)), dim=1)
        top_p, top_i = torch.topk(probs, 5, dim=1)
        return [
            {self.labels[str(i)]: p for i, p in zip(ids, ps, strict=True)}
            for ids, ps in zip(top_i.tolist(), top_p.tolist(), strict=True)
        ]


def as_bytes(body: Any) -> bytes:
    """A request body: raw bytes, or base64 text (the JSON peers' form of an image)."""
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    return base64.b64decode(body)
