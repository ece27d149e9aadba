"""``servetune archive``: package a model as torch-model-archiver does, with the same flags."""

from __future__ import annotations

import os

import click

from servetune.archive.manifest import RUNTIMES
from servetune.archive.writer import ARCHIVE_FORMATS, create_archive


@click.command(
    "archive",
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
    short_help="Package a model into a .mar archive (torch-model-archiver compatible).",
)
@click.option(
    "--model-name",
    required=True,
    help="Model name; the archive is written as <model-name>.mar. Letters, digits, '_', '-', '.'; "
    "it must start with a letter or digit.",
)
@click.option("--version", "-v", "version", required=True, help="Model version, e.g. 1.0.")
@click.option(
    "--serialized-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Weights: a state_dict .pt/.pth (eager mode, with --model-file), a TorchScript .pt, a PyTorch 2 .pt2 "
    "(an AOTInductor package or a saved ExportedProgram; no --model-file), or an .onnx file.",
)
@click.option(
    "--model-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Python file defining the model class (one torch.nn.Module subclass); needed for eager-mode weights.",
)
@click.option(
    "--handler",
    required=True,
    help="A built-in handler name (image_classifier, object_detector, image_segmenter, text_classifier, ...) "
    "or a handler file, optionally as path:function.",
)
@click.option(
    "--extra-files",
    default=None,
    help="Comma-separated files, directories (their contents are added) or glob patterns to add to the archive.",
)
@click.option(
    "--requirements-file",
    "-r",
    type=click.Path(exists=True, dir_okay=False),
    help="requirements.txt with the model's own Python dependencies.",
)
@click.option(
    "--config-file",
    "-c",
    type=click.Path(exists=True, dir_okay=False),
    help="model-config.yaml with per-model settings (batchSize, maxBatchDelay, minWorkers, ...).",
)
@click.option(
    "--export-path",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Directory to write the archive to.  [default: current directory]",
)
@click.option(
    "--archive-format",
    type=click.Choice(list(ARCHIVE_FORMATS)),
    default="default",
    help="default: deflated zip <name>.mar; zip-store: uncompressed zip <name>.mar; "
    "tgz: <name>.tar.gz; no-archive: a directory <export-path>/<name>/.",
)
@click.option(
    "--runtime",
    type=click.Choice(list(RUNTIMES)),
    default="python",
    help="Language the handler runs in.",
)
@click.option("--force", "-f", is_flag=True, help="Overwrite an existing archive of the same name.")
def command(
    model_name: str,
    version: str,
    serialized_file: str | None,
    model_file: str | None,
    handler: str,
    extra_files: str | None,
    requirements_file: str | None,
    config_file: str | None,
    export_path: str | None,
    archive_format: str,
    runtime: str,
    force: bool,
) -> None:
    """Package a model into an archive that TorchServe and servetune both serve, and print its path."""
    path = create_archive(
        model_name=model_name,
        version=version,
        handler=handler,
        export_path=export_path if export_path is not None else os.getcwd(),
        serialized_file=serialized_file,
        model_file=model_file,
        extra_files=extra_files or (),
        requirements_file=requirements_file,
        config_file=config_file,
        runtime=runtime,
        archive_format=archive_format,
        force=force,
    )
    click.echo(str(path))
