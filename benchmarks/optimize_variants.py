"""The variant table for torchvision resnet18 (random weights) on CPU, each variant's speed as a ratio to eager.

    python benchmarks/optimize_variants.py [--variants eager,torchscript,...] [--batch-sizes 1,8] [--repeat 20]

Variants are converted first, then timed round-robin (one call of each per round), so the ratios to eager hold
on a machine whose load drifts; absolute times depend on the machine and gate nothing.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

import torch
import torchvision
from rich.console import Console

from servetune.optimize import default_variants
from servetune.optimize.measure import measure_variants
from servetune.optimize.report import variant_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(default_variants()), help="comma-separated variant specs")
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per batch size (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per batch size")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    names = [n.strip() for n in args.variants.split(",")]
    names = ["eager", *[n for n in names if n != "eager"]]

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    device = torch.device("cpu")

    def make_inputs(batch: int) -> tuple[torch.Tensor]:
        return (torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch)),)

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
        )
    title = (
        f"resnet18 (random weights), CPU {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
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
