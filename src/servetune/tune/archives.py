"""Archives the tuner serves: per family, a copy of the model archive (the no-archive folder format, files
hard-linked where possible) whose model-config.yaml names the optimization and the device; and the winner's,
with its knobs written in, for deployment.

The served path applies a variant when the model config says ``optimization: NAME``; ``deviceType`` and
``deviceIds`` are TorchServe's own keys. An exported variant (``export``, ``aoti``) also gets ``export_max_batch``:
the family's largest batch size, so that one package, built and cached at the family's first registration, takes
every batch size the study tries (its compile cost is paid once, not per trial); an ``aoti`` family's load may
take minutes (it compiles), so its ``startupTimeout`` is raised unless the model config sets one. Batch size, delay
and workers are not written into trial archives: the register API sets them, so they can change without rebuilding
anything.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from servetune.archive import ModelArchive, open_archive
from servetune.archive.manifest import MANIFEST_PATH
from servetune.tune.study import Family

FRONTEND_KNOBS = ("batchSize", "maxBatchDelay", "minWorkers", "maxWorkers")
EXPORTED = frozenset({"export", "aoti"})  # variants whose batch dimension is exported with bounds
AOTI_STARTUP_TIMEOUT_S = 1800  # an AOTInductor compile of a ResNet-50-sized model takes minutes on a few cores
DEFAULT_CONFIG_FILE = "model-config.yaml"


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-.") or "model"


class ArchiveBuilder:
    """Builds family folders inside ``store`` (the embedded server's model store), opening each archive once."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self._opened: dict[Path, ModelArchive] = {}

    def open(self, archive: Path) -> ModelArchive:
        if archive not in self._opened:
            dest = self.store / ".extracted" / f"{len(self._opened)}-{slug(archive.name)}"
            shutil.rmtree(dest, ignore_errors=True)
            self._opened[archive] = open_archive(archive, dest)
        return self._opened[archive]

    def family(self, family: Family, extra: Mapping[str, Any] | None = None) -> str:
        """Write the family's folder and return its name in the store (the register API's ``url``); ``extra``:
        model-config keys the target adds."""
        name = slug(family.label)
        config = trial_model_config(self.open(family.archive).model_config, family, extra)
        write_archive(self.open(family.archive), self.store / name, config)
        return name

    def version(self, archive: Path) -> str:
        return str(self.open(archive).manifest.raw.get("model", {}).get("modelVersion") or "1.0")


def trial_model_config(
    base: Mapping[str, Any], family: Family, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    config = {k: v for k, v in base.items() if k not in FRONTEND_KNOBS}
    config.update(family.model_config)
    config["optimization"] = family.optimization
    if EXPORTED.intersection(family.optimization.split("+")):
        # One dynamic batch for every batch size the study tries: the package is built (and cached) once per family.
        largest = max(family.batch_sizes)
        given = config.get("export_max_batch")
        config["export_max_batch"] = max(largest, given) if isinstance(given, int) else largest
    if "aoti" in family.optimization.split("+") and "startupTimeout" not in config:
        config["startupTimeout"] = AOTI_STARTUP_TIMEOUT_S  # the first load compiles
    config["deviceType"] = "gpu" if family.device == "cuda" else "cpu"
    if family.gpus:
        config["deviceIds"] = list(range(family.gpus))
    config.update(extra or {})
    return config


def write_archive(source: ModelArchive, dest: Path, model_config: Mapping[str, Any]) -> Path:
    """Copy ``source`` into the folder ``dest`` with ``model_config`` as its model-config.yaml."""
    raw: dict[str, Any] = dict(source.manifest.raw)
    model_info = dict(raw.get("model") or {})
    config_file = model_info.get("configFile") or DEFAULT_CONFIG_FILE
    model_info["configFile"] = config_file
    raw["model"] = model_info
    skip = {Path(config_file), Path(MANIFEST_PATH)}
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in sorted(source.model_dir.rglob("*")):
        relative = path.relative_to(source.model_dir)
        if relative in skip or not path.is_file():
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(path, target)
    (dest / MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST_PATH).write_text(json.dumps(raw, indent=2) + "\n")
    (dest / config_file).parent.mkdir(parents=True, exist_ok=True)
    (dest / config_file).write_text(yaml.safe_dump(dict(model_config), sort_keys=False))
    return dest


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
