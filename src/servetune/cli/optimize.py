"""``servetune optimize``: try model variants on an archive's model in-process and print what each gives."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

_WRITE_SUFFIX = ".optimized"


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        sizes = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 1,8") from None
    if not sizes or any(size < 1 for size in sizes):
        raise click.BadParameter(f"{value!r}: expected comma-separated integers >= 1")
    return sizes


def _tolerances(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, float]:
    parsed: dict[str, float] = {}
    for item in value:
        key, sep, number = item.partition("=")
        try:
            parsed[key.strip()] = float(number)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected KEY=NUMBER, e.g. rtol=0.01") from None
        if not sep:
            raise click.BadParameter(f"{item!r}: expected KEY=NUMBER, e.g. rtol=0.01")
    return parsed


def artifacts_dir(archive: Path) -> Path:
    """Where ``--write`` puts converted artifacts: ``<name>.optimized/`` beside the archive."""
    name = archive.name
    for suffix in (".tar.gz", ".tgz", ".mar", ".zip"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return archive.parent / f"{name}{_WRITE_SUFFIX}"


@click.command(
    "optimize",
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
    short_help="Try model variants (bf16, TorchScript, ONNX, ...) on an archive: parity, latency, memory.",
)
@click.argument("archive", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--variants",
    default=None,
    help="Comma-separated variants, combinations joined by '+' (e.g. eager,torchscript,channels_last+bf16). "
    "[default: every variant and the default combinations]",
)
@click.option("--batch-sizes", default="1,8", callback=_int_list, help="Batch sizes to time, comma-separated.")
@click.option("--device", default=None, help="Torch device, e.g. cpu or cuda:0.  [default: cuda if present, else cpu]")
@click.option(
    "--repeat", default=20, type=click.IntRange(min=1), help="Timed calls per batch size (the median counts)."
)
@click.option("--warmup", default=3, type=click.IntRange(min=0), help="Untimed calls before timing each batch size.")
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch.set_num_threads for the run.")
@click.option(
    "--tolerance",
    "tolerances",
    multiple=True,
    callback=_tolerances,
    help="Override a parity tolerance for every variant, KEY=NUMBER (atol, rtol, min_top1, min_box_iou, "
    "max_score_diff, min_match, score_floor, iou_match); repeatable.",
)
@click.option(
    "--interleave",
    is_flag=True,
    help="Convert every variant first, then time them round-robin (steadier ratios on a busy machine; "
    "holds all variants in memory).",
)
@click.option(
    "--write", is_flag=True, help="Save converted artifacts (TorchScript .pt, .onnx) in <archive>.optimized/."
)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write the results as JSON."
)
def command(
    archive: Path,
    variants: str | None,
    batch_sizes: list[int],
    device: str | None,
    repeat: int,
    warmup: int,
    threads: int | None,
    tolerances: dict[str, float],
    interleave: bool,
    write: bool,
    json_path: Path | None,
) -> None:
    """Load ARCHIVE's model in-process, apply each variant, check it against eager and time it.

    A variant that cannot apply says why; one whose answers differ from eager beyond tolerance is rejected with
    the figures. Latencies are medians in milliseconds, with the speed ratio to eager from the same run.
    """
    import torch
    from rich.console import Console

    from servetune.optimize import default_variants, resolve
    from servetune.optimize.archive_model import load_archive_model
    from servetune.optimize.measure import measure_variants
    from servetune.optimize.report import results_json, variant_table

    names = [name.strip() for name in variants.split(",")] if variants else default_variants()
    for name in names:
        resolve(name)  # a malformed name fails before anything loads
    if "eager" not in names:
        names.insert(0, "eager")  # the baseline of the ratios and of parity
    names.sort(key=lambda n: n != "eager")
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if threads is not None:
        torch.set_num_threads(threads)
    console = Console(width=None if sys.stdout.isatty() else 160)  # a log file gets the whole table
    with tempfile.TemporaryDirectory(prefix="servetune-optimize-") as scratch:
        loaded = load_archive_model(archive, Path(scratch) / "model")
        model = loaded.model.to(target)
        cache_dir = artifacts_dir(archive) if write else Path(scratch) / "artifacts"
        with console.status("loading ...") as status:
            results = measure_variants(
                names,
                model,
                device=target,
                make_inputs=lambda batch: loaded.make_inputs(batch, target),
                batch_sizes=batch_sizes,
                repeat=repeat,
                warmup=warmup,
                cache_dir=cache_dir,
                tolerance=tolerances or None,
                interleave=interleave,
                progress=lambda text: status.update(f"{text} ..."),
            )
        title = f"{archive.name} on {target} ({torch.get_num_threads()} threads)"
        console.print(variant_table(results, batch_sizes, title=title))
    if write:
        console.print(f"artifacts written to {cache_dir}")
    if json_path is not None:
        json_path.write_text(json.dumps(results_json(results), indent=2, default=str))
