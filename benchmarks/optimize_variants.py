"""The variant table for torchvision resnet18, or the Animated Drawings detector (Mask R-CNN R50-FPN), random
weights, on CPU, each variant's speed as a ratio to eager.

    python benchmarks/optimize_variants.py [--model resnet18|detector] [--variants eager,torchscript,...]
        [--batch-sizes 1,8] [--repeat 20] [--threads N]

PyTorch 2's formats against the others (issue 23), one run, same threads:

    python benchmarks/optimize_variants.py --variants eager,torchscript,compile,onnx,export,aoti --threads 2

Variants are converted first (compile time: the ``convert s`` column, into a fresh cache, so ``aoti`` compiles),
then timed round-robin (one call of each per round), so the ratios to eager hold on a machine whose load drifts;
absolute times depend on the machine and gate nothing. After the table: p50 and throughput (items/s at the
largest batch, one worker) per variant, and aoti's p50 over TorchScript's at the smallest batch against the
target (<= 0.8, the 30-40% gain reported for AOTInductor over TorchScript), said met or not met.
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
    largest, smallest = max(batch_sizes), min(batch_sizes)
    console.print(f"p50 ms per batch size, throughput at batch {largest} (items/s, one worker), compile s:")
    for result in results:
        if result.status == "ok":
            p50 = "  ".join(f"b{b} {result.latency_ms[b]:.3g}" for b in batch_sizes)
            throughput = largest * 1000.0 / result.latency_ms[largest]
            console.print(f"  {result.variant:28s} {p50}  {throughput:.3g} items/s  compile {result.convert_s:.3g}")
    by_name = {r.variant: r for r in results if r.status == "ok"}
    if "aoti" in by_name and "torchscript" in by_name:
        ratio = by_name["aoti"].latency_ms[smallest] / by_name["torchscript"].latency_ms[smallest]
        verdict = "met" if ratio <= 0.8 else "NOT met"
        console.print(f"aoti p50 / torchscript p50 at batch {smallest}: {ratio:.2f} (target <= 0.80: {verdict})")


if __name__ == "__main__":
    main()
