"""A model variant applied by the worker at load (model-config.yaml ``optimization``), served end to end."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from http_client import call
from servetune.archive import create_archive

TINY_CNN = textwrap.dedent(
    """
    import torch

    class TinyCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.head = torch.nn.Linear(8, 10)

        def forward(self, x):
            x = torch.relu(self.conv(x))
            return self.head(x.mean(dim=(2, 3)))
    """
)


def _archive(tmp_path: Path, name: str, model_config: dict[str, object]) -> Path:
    src = tmp_path / f"src-{name}"
    src.mkdir()
    (src / "model.py").write_text(TINY_CNN)
    namespace: dict[str, object] = {}
    exec(TINY_CNN, namespace)  # the same class the archive carries
    torch.manual_seed(0)
    model = namespace["TinyCNN"]()  # type: ignore[operator]
    torch.save(model.state_dict(), src / "weights.pt")
    (src / "model-config.yaml").write_text(yaml.safe_dump(model_config))
    return create_archive(model_name=name, version="1.0", handler="image_classifier", model_file=src / "model.py",
                          serialized_file=src / "weights.pt", config_file=src / "model-config.yaml",
                          export_path=tmp_path / "store")


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(buf, format="PNG")
    return buf.getvalue()


def test_torchscript_variant_serves_the_same_answers_as_eager(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "store").mkdir()
    _archive(tmp_path, "eager", {})
    _archive(tmp_path, "scripted", {"optimization": "torchscript"})
    server = start_server(model_store=tmp_path / "store", models={"eager": "eager.mar", "scripted": "scripted.mar"})
    image = _png()
    eager = call("POST", f"{server.inference_url}/predictions/eager", image, {"Content-Type": "image/png"})
    scripted = call("POST", f"{server.inference_url}/predictions/scripted", image, {"Content-Type": "image/png"})
    assert eager.status == 200 and scripted.status == 200, scripted.body
    top_eager, top_scripted = eager.json(), scripted.json()
    assert list(top_eager) == list(top_scripted)  # same top-5 classes, same order
    for label, prob in top_eager.items():
        assert top_scripted[label] == pytest.approx(prob, abs=1e-4)


def test_variant_outside_tolerance_fails_registration_with_figures(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "store").mkdir()
    _archive(tmp_path, "strict", {"optimization": "bf16", "parity_tolerance": {"atol": 0.0, "rtol": 0.0}})
    server = start_server(model_store=tmp_path / "store", properties={"enable_model_api": "true"})
    reply = call("POST", f"{server.management_url}/models?url=strict.mar&initial_workers=1", timeout=180)
    assert reply.status == 500
    message = reply.json()["message"]
    assert "bf16" in message and "ParityError" in message, message
