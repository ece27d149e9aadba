"""``servetune optimize --write`` for the exported variants: an archive that serves the ``.pt2`` as it is.

The new archive keeps what the source archive serves with (its handler, handler files, extra files, requirements and
model-config.yaml) and swaps the model: the ``.pt2`` becomes the serialized file, and there is no model file (a
``.pt2`` is the whole model; the model file is still packed, as an extra file, for handlers that import it). The
eager weights are left out, and so are the model-config keys that would convert it again (``optimization``,
``parity_tolerance``, ``export_max_batch``): the worker loads the package and runs, with nothing to compile.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from servetune.archive import ModelArchive, create_archive
from servetune.archive.manifest import MANIFEST_PATH
from servetune.archive.writer import BUILTIN_HANDLERS

#: model-config keys that only matter when a variant is built at load, which a .pt2 archive never does
VARIANT_KEYS = ("optimization", "parity_tolerance", "export_max_batch")


def pt2_archive_name(model_name: str, variant: str) -> str:
    return f"{model_name}-{variant.replace('+', '_')}.mar"


def write_pt2_archive(source: ModelArchive, package: Path, variant: str, out_dir: Path) -> Path:
    """Write ``<out_dir>/<model>-<variant>.mar`` serving ``package`` with ``source``'s handler and files."""
    info = source.manifest.model
    model_name = info.model_name or source.source.name.split(".")[0]
    skip = {MANIFEST_PATH, info.serialized_file, info.config_file, info.requirements_file}
    handler = info.handler or "base_handler"
    handler_file, sep, function = handler.partition(":")
    if handler_file not in BUILTIN_HANDLERS:
        skip.add(handler_file if handler_file.endswith(".py") else f"{handler_file}.py")
    with tempfile.TemporaryDirectory(prefix="servetune-pt2-archive-") as tmp:
        work = Path(tmp)
        staged = work / "files"
        staged.mkdir()
        for path in sorted(source.model_dir.iterdir()):
            if path.name in skip or path.name.startswith(".") or path.name == "MAR-INF":
                continue
            if path.is_dir():
                shutil.copytree(path, staged / path.name)
            else:
                shutil.copy2(path, staged / path.name)
        serialized = work / f"{model_name}.pt2"
        shutil.copy2(package, serialized)
        config = work / (info.config_file or "model-config.yaml")
        config.write_text(yaml.safe_dump(_served_config(source.model_config), sort_keys=False))
        if handler_file not in BUILTIN_HANDLERS:
            handler = str(source.model_dir / handler_file) + (sep + function if sep else "")
        requirements = source.model_dir / info.requirements_file if info.requirements_file else None
        made = create_archive(
            model_name=model_name,
            version=info.model_version or "1.0",
            handler=handler,
            export_path=work,
            serialized_file=serialized,
            extra_files=[str(staged)] if any(staged.iterdir()) else (),
            requirements_file=requirements,
            config_file=config,
            runtime=source.manifest.runtime,
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / pt2_archive_name(model_name, variant)
        shutil.move(str(made), target)
    return target


def _served_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key not in VARIANT_KEYS}
