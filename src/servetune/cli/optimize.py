"""``servetune optimize``: try model variants on an archive's model in-process and print what each gives."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from servetune.archive import ModelArchive
    from servetune.optimize.measure import VariantResult

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


def _configured_batches(config: Mapping[str, Any]) -> list[int]:
    """The model-config's ``batchSize`` and ``export_max_batch``, where they are positive integers."""
    values = (config.get("batchSize"), config.get("export_max_batch"))
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]


def _write(source: Path, archive: ModelArchive, results: Sequence[VariantResult]) -> Iterator[str]:
    """Copy each converted artifact into ``<archive>.optimized/``, and write an archive for each ``.pt2``."""
    from servetune.archive.pt2 import inspect_pt2
    from servetune.optimize.pt2_archive import write_pt2_archive

    out = artifacts_dir(source)
    out.mkdir(parents=True, exist_ok=True)
    for result in results:
        if result.status != "ok" or result.artifact is None:
            continue
        artifact = Path(result.artifact)
        shutil.copy2(artifact, out / artifact.name)
        result.artifact = str(out / artifact.name)  # the results point at the copy the user keeps
        if artifact.suffix == ".pt2":
            written = write_pt2_archive(archive, artifact, result.variant, out)
            yield f"{result.variant}: {written} (serves {artifact.name} as it is, nothing to convert at load)"
            bounds = inspect_pt2(artifact).batch_bounds()
            batch_size = archive.model_config.get("batchSize")
            if bounds and bounds[1] is not None and isinstance(batch_size, int) and batch_size > bounds[1]:
                yield f"  note: its batchSize {batch_size} is above the batch bound {bounds[1]}: raise --max-batch"
    yield f"artifacts written to {out}"


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
    "--max-batch",
    default=None,
    type=click.IntRange(min=1),
    help="The largest batch the exported variants (export, aoti) take: their dynamic batch is 1..N.  "
    "[default: the largest of --batch-sizes and the archive's batchSize / export_max_batch]",
)
@click.option(
    "--cache-dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where converted artifacts are cached (servers share it, so what is built here is not built again at "
    "load).  [default: $SERVETUNE_VARIANT_CACHE or ~/.cache/servetune/variants]",
)
@click.option(
    "--write",
    is_flag=True,
    help="Copy converted artifacts (TorchScript .pt, .onnx, .pt2) into <archive>.optimized/, and for export and aoti "
    "also write <model>-<variant>.mar there: the archive serving that .pt2, with nothing to convert at load.",
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
    max_batch: int | None,
    cache_dir: Path | None,
    write: bool,
    json_path: Path | None,
) -> None:
    """Load ARCHIVE's model in-process, apply each variant, check it against eager and time it.

    A variant that cannot apply says why; one whose answers differ from eager beyond tolerance is rejected with
    the figures. Latencies are medians in milliseconds, with the speed ratio to eager from the same run.
    """
    import torch
    from rich.console import Console

    from servetune.optimize import default_cache_dir, default_variants, resolve
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
    cache = cache_dir or default_cache_dir()
    with tempfile.TemporaryDirectory(prefix="servetune-optimize-") as scratch:
        loaded = load_archive_model(archive, Path(scratch) / "model")
        model = loaded.model.to(target)
        bound = max_batch or max([*batch_sizes, *_configured_batches(loaded.archive.model_config)])
        with console.status("loading ...") as status:
            results = measure_variants(
                names,
                model,
                device=target,
                make_inputs=lambda batch: loaded.make_inputs(batch, target),
                batch_sizes=batch_sizes,
                repeat=repeat,
                warmup=warmup,
                cache_dir=cache,
                tolerance=tolerances or None,
                interleave=interleave,
                progress=lambda text: status.update(f"{text} ..."),
                max_batch=bound,
            )
        title = f"{archive.name} on {target} ({torch.get_num_threads()} threads)"
        console.print(variant_table(results, batch_sizes, title=title))
        if write:
            for line in _write(archive, loaded.archive, results):
                console.print(line)
    if json_path is not None:
        json_path.write_text(json.dumps(results_json(results), indent=2, default=str))
