"""Build ``resnet18.mar``: torchvision ResNet-18 with random weights (seed 0), the built-in image_classifier.

No weights can be downloaded here, so the classifier's answers are meaningless; its cost is real.
Usage: python examples/resnet18/make_archive.py --out model_store [--image sample.png]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch
from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent


def sample_image(path: Path, seed: int = 0, size: tuple[int, int] = (320, 240)) -> Path:
    """A seeded picture of coloured shapes, a stand-in for a photo."""
    rng = random.Random(seed)
    image = Image.new("RGB", size, (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
        x1, y1 = x0 + rng.randrange(20, 120), y0 + rng.randrange(20, 120)
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    image.save(path)
    return path


def build(out: Path, *, force: bool = True) -> Path:
    import sys

    from servetune.archive import create_archive

    sys.path.insert(0, str(HERE))
    from model import ResNet18

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "resnet18.pt"
        torch.save(ResNet18().eval().state_dict(), weights)
        labels = Path(tmp) / "index_to_name.json"
        labels.write_text(json.dumps({str(i): f"class_{i}" for i in range(1000)}))
        return create_archive(
            model_name="resnet18",
            version="1.0",
            handler="image_classifier",
            serialized_file=str(weights),
            model_file=str(HERE / "model.py"),
            extra_files=[str(labels)],
            export_path=str(out),
            force=force,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="model store directory to write resnet18.mar into")
    parser.add_argument("--image", type=Path, help="also write a sample input image here")
    args = parser.parse_args()
    print(build(args.out))
    if args.image:
        print(sample_image(args.image))


if __name__ == "__main__":
    main()
