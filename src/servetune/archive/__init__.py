"""Model archives: read and write TorchServe's ``.mar`` (zip), ``.tar.gz`` and directory formats.

``open_archive`` extracts safely and parses ``MAR-INF/MANIFEST.json`` and the model-config YAML;
``create_archive`` writes what ``torch-model-archiver`` 0.12 writes. See docs/archive.md.
"""

from __future__ import annotations

from servetune.archive.manifest import Manifest, ManifestModel, validate_model_name
from servetune.archive.reader import ModelArchive, open_archive
from servetune.archive.writer import create_archive

__all__ = ["Manifest", "ManifestModel", "ModelArchive", "create_archive", "open_archive", "validate_model_name"]
