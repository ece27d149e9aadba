"""Per-image cost of both handlers in-process (decode + preprocess + model + postprocess), at several detector
input sizes: the figures behind the sizes chosen in detector.yaml, quick.yaml and the tests.

    python examples/animated_drawings/measure_cost.py --store examples/animated_drawings/model_store \\
        [--sizes 128,256,512,800] [--threads 1] [--images 8]

Prints, per model and size, the median wall time and the median CPU time (process time) per image at batch 1 and
per image at batch 4. On a shared machine the CPU time is the steadier figure: waiting for a core is not counted.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from servetune.archive import open_archive
from servetune.handlers import InputParam, Request, Service, load_service

HERE = Path(__file__).resolve().parent


def load(store: Path, name: str, work: Path, config: dict[str, Any]) -> Service:
    archive = open_archive(store / f"{name}.mar", work / f"{name}-{len(list(work.iterdir()))}")
    manifest = json.loads((archive.model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    return load_service(
        model_dir=archive.model_dir,
        manifest=manifest,
        model_name=name,
        gpu_id=None,
        batch_size=4,
        model_yaml_config={**archive.model_config, **config},
    )


def timed(call: Callable[[], None], runs: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``call`` over ``runs`` runs, after one warm-up run."""
    call()
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def per_image(service: Service, images: list[bytes], runs: int) -> list[float]:
    def batch_of(items: list[bytes]) -> Callable[[], None]:
        requests = [Request(str(i), {}, [InputParam("data", "image/png", item)]) for i, item in enumerate(items)]

        def call() -> None:
            responses = service.predict(requests)
            assert all(r.status == 200 for r in responses), responses[0].body

        return call

    one = [timed(batch_of([image]), 1) for image in images[:runs]]
    four = timed(batch_of(images[:4]), max(1, runs // 4))
    return [
        statistics.median(w for w, _ in one),
        statistics.median(c for _, c in one),
        four[0] / 4,
        four[1] / 4,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="model store made by make_archives.py")
    parser.add_argument("--sizes", default="128,256,512,800", help="detector min_size=max_size values")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as one worker per core)")
    parser.add_argument("--images", type=int, default=8, help="drawings measured one by one (default 8)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    from drawings import make_drawing

    images = []
    for seed in range(args.images):
        buffer = io.BytesIO()
        make_drawing(seed, min_side=300, max_side=1000).image.save(buffer, format="PNG")
        images.append(buffer.getvalue())
    crops = []
    for seed in range(args.images):
        drawing = make_drawing(seed)
        buffer = io.BytesIO()
        drawing.image.crop(drawing.bbox).save(buffer, format="PNG")
        crops.append(buffer.getvalue())
    print(f"torch {torch.__version__}, {args.threads} thread(s); per image, median: wall / CPU ms")
    print(f"{'model':<40} {'batch 1':>17} {'batch 4':>17}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        service = load(args.store, "drawn_humanoid_pose_estimator", work, {})
        w1, c1, w4, c4 = per_image(service, crops, args.images)
        print(f"{'pose estimator (256x192)':<40} {w1:>8.0f} / {c1:>5.0f} {w4:>8.0f} / {c4:>5.0f}", flush=True)
        for size in (int(s) for s in args.sizes.split(",")):
            settings = {"min_size": size, "max_size": size if size < 800 else 1333}
            service = load(args.store, "drawn_humanoid_detector", work, {"detector": settings})
            w1, c1, w4, c4 = per_image(service, images, args.images)
            label = f"detector {settings['min_size']}/{settings['max_size']} px"
            print(f"{label:<40} {w1:>8.0f} / {c1:>5.0f} {w4:>8.0f} / {c4:>5.0f}", flush=True)


if __name__ == "__main__":
    main()
