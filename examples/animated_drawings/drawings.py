"""Seeded synthetic children's drawings: the benchmark inputs of the Animated Drawings example.

Each picture is a paper-coloured page (plain, cream, grey or lined, with a little grain) holding one humanoid
figure drawn in crayon-like strokes (several jittered, semi-transparent passes with gaps), either a stick figure
or a blob figure (filled body, sausage limbs), sometimes with a few doodles around it (sun, grass, scribbles).
Sizes vary, the longest side up to 1000 px as the app sends. The same seed gives the same pictures, and each
comes with the figure's box and its 17 COCO keypoints, which the drawing was built from (``--labels FILE``; kept out
of the image folder, whose every file a benchmark sends).

    python examples/animated_drawings/drawings.py --out drawings --count 32 --seed 0 [--labels labels.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

Point = tuple[float, float]

PAPERS = [(252, 251, 246), (255, 255, 255), (246, 238, 214), (232, 232, 228), (250, 246, 236)]
CRAYONS = [(200, 30, 40), (30, 90, 200), (30, 140, 60), (240, 150, 20), (120, 50, 160), (40, 40, 40), (230, 90, 150)]


@dataclass(frozen=True)
class Drawing:
    image: Image.Image
    bbox: tuple[float, float, float, float]  # x1, y1, x2, y2 of the figure
    keypoints: list[Point]  # 17, COCO order


def paper(rng: random.Random, width: int, height: int) -> Image.Image:
    """A page: paper colour, grain, and sometimes ruled lines."""
    colour = np.array(rng.choice(PAPERS), dtype=np.float32)
    grain = np.random.default_rng(rng.getrandbits(32)).normal(0.0, rng.uniform(2, 6), (height, width, 1))
    page = Image.fromarray(np.clip(colour + grain, 0, 255).astype(np.uint8))
    if rng.random() < 0.3:
        draw = ImageDraw.Draw(page)
        for y in range(rng.randrange(20, 40), height, rng.randrange(28, 40)):
            draw.line([(0, y), (width, y)], fill=(160, 190, 230), width=1)
    return page


def crayon(
    layer: ImageDraw.ImageDraw, rng: random.Random, points: list[Point], colour: tuple[int, ...], width: float
) -> None:
    """A waxy stroke along ``points``: a few jittered passes of short, semi-transparent dabs with gaps."""
    for _ in range(rng.randint(2, 4)):
        jitter = width * 0.35
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            steps = max(1, int(math.dist((x0, y0), (x1, y1)) / 5))
            for i in range(steps):
                if rng.random() < 0.08:
                    continue  # the paper shows through
                t0, t1 = i / steps, (i + 1) / steps
                a = (
                    x0 + (x1 - x0) * t0 + rng.uniform(-jitter, jitter),
                    y0 + (y1 - y0) * t0 + rng.uniform(-jitter, jitter),
                )
                b = (
                    x0 + (x1 - x0) * t1 + rng.uniform(-jitter, jitter),
                    y0 + (y1 - y0) * t1 + rng.uniform(-jitter, jitter),
                )
                alpha = rng.randint(110, 220)
                layer.line([a, b], fill=(*colour, alpha), width=max(1, round(width * rng.uniform(0.6, 1.1))))


def ellipse_points(cx: float, cy: float, rx: float, ry: float, rng: random.Random, n: int = 24) -> list[Point]:
    """A wobbly closed outline, as a child draws a circle."""
    start = rng.uniform(0, 2 * math.pi)
    wobble = [rng.uniform(0.9, 1.1) for _ in range(n)]
    pts = [
        (
            cx + rx * wobble[i] * math.cos(start + 2 * math.pi * i / n),
            cy + ry * wobble[i] * math.sin(start + 2 * math.pi * i / n),
        )
        for i in range(n)
    ]
    return [*pts, pts[0]]


def skeleton(rng: random.Random, cx: float, top: float, height: float) -> list[Point]:
    """17 COCO keypoints of a standing figure, arms and legs at random angles."""
    unit = height / 8.0
    head_y = top + unit
    shoulder_y, hip_y = top + 2.4 * unit, top + 5.0 * unit
    half_shoulder, half_hip = unit * rng.uniform(0.7, 1.1), unit * rng.uniform(0.4, 0.7)
    pts: list[Point] = [
        (cx, head_y),
        (cx - 0.3 * unit, head_y - 0.2 * unit),
        (cx + 0.3 * unit, head_y - 0.2 * unit),
        (cx - 0.6 * unit, head_y),
        (cx + 0.6 * unit, head_y),
        (cx - half_shoulder, shoulder_y),
        (cx + half_shoulder, shoulder_y),
    ]
    elbows, wrists = [], []
    for side in (-1, 1):
        angle = math.radians(rng.uniform(-60, 80))  # 0: arm straight out, positive: down
        elbow = (cx + side * (half_shoulder + 1.3 * unit * math.cos(angle)), shoulder_y + 1.3 * unit * math.sin(angle))
        bend = angle + math.radians(rng.uniform(-40, 40))
        elbows.append(elbow)
        wrists.append((elbow[0] + side * 1.2 * unit * math.cos(bend), elbow[1] + 1.2 * unit * math.sin(bend)))
    hips = [(cx - half_hip, hip_y), (cx + half_hip, hip_y)]
    knees, ankles = [], []
    for side, hip in zip((-1, 1), hips, strict=True):
        spread = math.radians(rng.uniform(0, 25))
        knee = (hip[0] + side * 1.4 * unit * math.sin(spread), hip_y + 1.4 * unit * math.cos(spread))
        knees.append(knee)
        ankles.append((knee[0] + side * 0.2 * unit * rng.random(), knee[1] + 1.5 * unit))
    return [
        *pts,
        elbows[0],
        elbows[1],
        wrists[0],
        wrists[1],
        hips[0],
        hips[1],
        knees[0],
        knees[1],
        ankles[0],
        ankles[1],
    ]


def figure(layer: ImageDraw.ImageDraw, rng: random.Random, kp: list[Point], height: float, stick: bool) -> None:
    colour, width = rng.choice(CRAYONS), max(2.0, height / rng.uniform(40, 70))
    unit = height / 8.0
    limbs = [(5, 7, 9), (6, 8, 10), (11, 13, 15), (12, 14, 16)]
    neck = ((kp[5][0] + kp[6][0]) / 2, (kp[5][1] + kp[6][1]) / 2)
    pelvis = ((kp[11][0] + kp[12][0]) / 2, (kp[11][1] + kp[12][1]) / 2)
    if stick:
        crayon(layer, rng, [neck, pelvis], colour, width)
        crayon(layer, rng, [kp[5], kp[6]], colour, width)
        crayon(layer, rng, [kp[11], kp[12]], colour, width)
    else:
        fill = (*rng.choice(CRAYONS), 150)
        body = ellipse_points(
            neck[0], (neck[1] + pelvis[1]) / 2, unit * 1.1, (pelvis[1] - neck[1]) / 2 + unit * 0.3, rng
        )
        layer.polygon(body, fill=fill)
        crayon(layer, rng, body, colour, width)
    for a, b, c in limbs:
        crayon(layer, rng, [kp[a], kp[b], kp[c]], colour, width if stick else width * 2.5)
    head = ellipse_points(kp[0][0], kp[0][1], unit * 0.8, unit * 0.9, rng)
    if not stick:
        layer.polygon(head, fill=(*rng.choice(CRAYONS), 90))
    crayon(layer, rng, head, colour, width)
    for eye in (kp[1], kp[2]):
        layer.ellipse([eye[0] - width, eye[1] - width, eye[0] + width, eye[1] + width], fill=(*colour, 230))


def doodles(layer: ImageDraw.ImageDraw, rng: random.Random, width: int, height: int) -> None:
    if rng.random() < 0.5:  # a sun in a corner
        r = min(width, height) * rng.uniform(0.05, 0.09)
        cx, cy = rng.choice([r * 1.5, width - r * 1.5]), r * 1.5
        crayon(layer, rng, ellipse_points(cx, cy, r, r, rng), (240, 190, 20), max(2.0, r / 8))
    if rng.random() < 0.5:  # grass along the bottom
        base = height - height * 0.04
        step = max(6, width // 60)
        grass: list[Point] = [
            (float(x), base - (height * 0.03 if i % 2 else 0.0)) for i, x in enumerate(range(0, width, step))
        ]
        crayon(layer, rng, grass, (40, 150, 50), max(2.0, width / 300))
    for _ in range(rng.randint(0, 2)):  # a scribble
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        pts = [(x + rng.uniform(-40, 40), y + rng.uniform(-40, 40)) for _ in range(6)]
        crayon(layer, rng, pts, rng.choice(CRAYONS), 2.0)


def make_drawing(seed: int, *, min_side: int = 300, max_side: int = 1000) -> Drawing:
    """One drawing from ``seed``; its longest side is between ``min_side`` and ``max_side`` pixels."""
    rng = random.Random(seed)
    longest = rng.randint(min_side, max_side)
    aspect = rng.uniform(0.65, 1.5)  # width / height
    width, height = (longest, round(longest / aspect)) if aspect >= 1 else (round(longest * aspect), longest)
    page = paper(rng, width, height).convert("RGBA")
    layer = Image.new("RGBA", page.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    doodles(draw, rng, width, height)
    fig_h = height * rng.uniform(0.45, 0.8)
    cx = width * rng.uniform(0.35, 0.65)
    top = rng.uniform(0.05, 0.95 - fig_h / height) * height
    kp = skeleton(rng, cx, top, fig_h)
    figure(draw, rng, kp, fig_h, stick=rng.random() < 0.5)
    image = Image.alpha_composite(page, layer).convert("RGB")
    margin = fig_h / 8.0
    xs, ys = [p[0] for p in kp], [p[1] for p in kp]
    bbox = (
        max(0.0, min(xs) - margin),
        max(0.0, min(ys) - margin),
        min(float(width), max(xs) + margin),
        min(float(height), max(ys) + margin),
    )
    return Drawing(image, bbox, kp)


def write_drawings(
    out: Path, count: int, seed: int = 0, *, min_side: int = 300, max_side: int = 1000, labels: Path | None = None
) -> list[Path]:
    """Write ``count`` PNGs (``drawing_0000.png``, ...) into ``out``, and their boxes and keypoints as JSON into
    ``labels`` if given; return the PNG paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths, truth = [], {}
    for i in range(count):
        drawing = make_drawing(seed * 100_003 + i, min_side=min_side, max_side=max_side)
        path = out / f"drawing_{i:04d}.png"
        drawing.image.save(path)
        paths.append(path)
        truth[path.name] = {
            "bbox": [round(v, 1) for v in drawing.bbox],
            "keypoints": [[round(x, 1), round(y, 1)] for x, y in drawing.keypoints],
        }
    if labels is not None:
        labels.write_text(json.dumps(truth, indent=1))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the PNGs into")
    parser.add_argument("--count", type=int, default=32, help="number of drawings (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--min-side", type=int, default=300, help="smallest longest side in pixels (default 300)")
    parser.add_argument("--max-side", type=int, default=1000, help="largest longest side in pixels (default 1000)")
    parser.add_argument("--labels", type=Path, help="also write each figure's box and keypoints to this JSON file")
    args = parser.parse_args()
    paths = write_drawings(
        args.out, args.count, args.seed, min_side=args.min_side, max_side=args.max_side, labels=args.labels
    )
    print(f"wrote {len(paths)} drawings to {args.out}")


if __name__ == "__main__":
    main()
