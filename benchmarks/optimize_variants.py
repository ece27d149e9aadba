"""The variant table for torchvision resnet18, or the Animated Drawings detector (Mask R-CNN R50-FPN), random
weights, on CPU, each variant's speed as a ratio to eager.

    python benchmarks/optimize_variants.py [--model resnet18|detector] [--variants eager,torchscript,...]
        [--batch-sizes 1,8] [--repeat 20]

Variants are converted first, then timed round-robin (one call of each per round), so the ratios to eager hold
on a machine whose load drifts; absolute times depend on the machine and gate nothing.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torchvision
from rich.console import Console

from servetune.optimize import default_variants, sample_inputs
from servetune.optimize.measure import measure_variants
from servetune.optimize.report import variant_table


def detector(size: int) -> torch.nn.Module:
    """The example's detector as served by quick.yaml: fixed input size, score threshold 0, 10 detections."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "animated_drawings"))
    from detector_model import DrawnHumanoidDetector

    model = DrawnHumanoidDetector().eval()
    model.transform.min_size, model.transform.max_size = (size,), size
    model.roi_heads.score_thresh, model.roi_heads.detections_per_img = 0.0, 10
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(default_variants()), help="comma-separated variant specs")
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per batch size (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per batch size")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--model", choices=["resnet18", "detector"], default="resnet18", help="which model")
    parser.add_argument("--detector-size", type=int, default=256, help="detector input size (px)")
    parser.add_argument(
        "--tolerance",
        default="",
        help="parity tolerance overrides, e.g. min_box_iou=0.5,min_match=0.2 (random-weight detectors have near-tied "
        "scores, so low precision re-ranks boxes a trained model would not; say so when you quote such figures)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    names = [n.strip() for n in args.variants.split(",")]
    names = ["eager", *[n for n in names if n != "eager"]]

    torch.manual_seed(0)
    device = torch.device("cpu")
    if args.model == "detector":
        model, label = detector(args.detector_size), f"Animated Drawings detector ({args.detector_size} px)"
    else:
        model, label = torchvision.models.resnet18(weights=None).eval(), "resnet18"

    def make_inputs(batch: int) -> tuple[Any, ...]:
        shape = (3, args.detector_size, args.detector_size) if args.model == "detector" else (3, 224, 224)
        return sample_inputs(model, shape, batch, device)

    console = Console(width=200)
    with tempfile.TemporaryDirectory() as cache:
        results = measure_variants(
            names,
            model,
            device=device,
            make_inputs=make_inputs,
            batch_sizes=batch_sizes,
            repeat=args.repeat,
            warmup=args.warmup,
            cache_dir=Path(cache),
            interleave=True,
            tolerance={k: float(v) for k, v in (kv.split("=") for kv in args.tolerance.split(",") if kv)} or None,
        )
    title = (
        f"{label} (random weights), CPU {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
        + (f", parity tolerance overrides: {args.tolerance}" if args.tolerance else "")
    )
    console.print(variant_table(results, batch_sizes, title=title))
    eager = results[0]
    console.print("speed as a ratio to eager (higher is faster):")
    for result in results:
        if result.status != "ok":
            console.print(f"  {result.variant:28s} {result.status}: {result.reason}")
            continue
        ratios = "  ".join(f"b{b} {result.speedup(eager, b) or 0.0:.2f}x" for b in batch_sizes)
        console.print(f"  {result.variant:28s} {ratios}")


if __name__ == "__main__":
    main()
