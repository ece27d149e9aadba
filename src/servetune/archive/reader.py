"""Open a model archive: a ``.mar`` zip, a ``.tar.gz``, or a plain directory (the no-archive format).

Archives are extracted, safely, into a directory the caller chooses; directories are used in place.
The manifest is read from ``MAR-INF/MANIFEST.json`` (an absent one gives the empty manifest, as in
TorchServe) and the ``model-config.yaml`` it names, if any, is read by ``servetune.config.model_yaml``: what
``yaml.safe_load`` accepts, within limits, as plain JSON data, or an ArchiveError naming the key.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servetune._exceptions import ArchiveError, ConfigError
from servetune.archive.extract import extract_tar_gz, extract_zip, safe_parts
from servetune.archive.manifest import MANIFEST_PATH, Manifest
from servetune.config.model_yaml import MAX_MODEL_CONFIG_BYTES, load_model_yaml

__all__ = [
    "DEFAULT_MAX_MEMBERS",
    "DEFAULT_MAX_UNCOMPRESSED_BYTES",
    "MAX_MANIFEST_BYTES",
    "ModelArchive",
    "open_archive",
]

DEFAULT_MAX_UNCOMPRESSED_BYTES = 8 << 30
DEFAULT_MAX_MEMBERS = 100_000
MAX_MANIFEST_BYTES = 64 * 1024  # torch-model-archiver writes under 1 KB; the manifest travels to every worker

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class ModelArchive:
    """An opened model archive: where its files are and what its manifest and model config say."""

    source: Path
    model_dir: Path
    manifest: Manifest
    model_config: dict[str, Any] = field(default_factory=dict)
    extracted: bool = False
    """True when ``model_dir`` is a fresh extraction (the caller's ``dest``), False for a directory used in place."""


def open_archive(
    source: Path,
    dest: Path,
    *,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> ModelArchive:
    """Open ``source`` and return its :class:`ModelArchive`.

    A zip or gzipped tar (recognised by content, not by name) is extracted into ``dest``, which must not
    exist or be empty; on any error ``dest`` is left as it was found. A directory is used in place and
    ``dest`` is not touched; as in TorchServe, a directory whose only entry is a directory stands for that
    directory (a tarball unpacked with its top-level folder).
    """
    source = Path(source)
    dest = Path(dest)
    if max_uncompressed_bytes <= 0:
        raise ArchiveError(f"max_uncompressed_bytes must be positive, got {max_uncompressed_bytes}")
    if source.is_dir():
        model_dir = _directory_model(source.resolve())
        return _load(source, model_dir, extracted=False)
    if not source.is_file():
        raise ArchiveError(f"{source}: no such model archive")
    extract = _extractor(source)
    created = _prepare_dest(dest)
    try:
        extract(source, dest, limit=max_uncompressed_bytes, max_members=max_members)
        return _load(source, dest.resolve(), extracted=True)
    except BaseException:
        _undo(dest, created)
        raise


def _extractor(source: Path) -> Callable[..., None]:
    try:
        with source.open("rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise ArchiveError(f"{source}: cannot read: {exc}") from exc
    if head in _ZIP_MAGIC:
        return extract_zip
    if head.startswith(_GZIP_MAGIC):
        return extract_tar_gz
    raise ArchiveError(f"{source}: not a model archive (expected a .mar zip, a .tar.gz or a directory)")


def _directory_model(directory: Path) -> Path:
    entries = list(directory.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and entries[0].name != "MAR-INF":
        return entries[0]
    return directory


def _prepare_dest(dest: Path) -> bool:
    """Make sure ``dest`` is an empty directory; return True if it had to be created."""
    if dest.is_dir() and not dest.is_symlink():
        if any(dest.iterdir()):
            raise ArchiveError(f"{dest}: extraction directory is not empty")
        return False
    if dest.exists() or dest.is_symlink():
        raise ArchiveError(f"{dest}: extraction target exists and is not a directory")
    try:
        dest.mkdir(parents=True)
    except OSError as exc:
        raise ArchiveError(f"{dest}: cannot create extraction directory: {exc}") from exc
    return True


def _undo(dest: Path, created: bool) -> None:
    if created:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _load(source: Path, model_dir: Path, *, extracted: bool) -> ModelArchive:
    manifest_file = model_dir / MANIFEST_PATH
    if manifest_file.is_file():
        raw = _read_bytes(manifest_file, source, limit=MAX_MANIFEST_BYTES)
        manifest = Manifest.from_json(raw, where=f"{source}: {MANIFEST_PATH}")
    else:
        manifest = Manifest.from_dict({})
    config = _model_config(source, model_dir, manifest.model.config_file)
    return ModelArchive(source=source, model_dir=model_dir, manifest=manifest, model_config=config, extracted=extracted)


def _read_bytes(path: Path, source: Path, *, limit: int) -> bytes:
    """The file's bytes; ArchiveError if it cannot be read or is larger than ``limit`` (never read past it)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise ArchiveError(f"{source}: cannot read {path.name}: {exc}") from exc
    if len(raw) > limit:
        raise ArchiveError(f"{source}: {path.name} is larger than the limit of {limit} bytes")
    return raw


def _model_config(source: Path, model_dir: Path, config_file: str | None) -> dict[str, Any]:
    if not config_file:
        return {}
    parts = safe_parts(config_file, archive=source)
    path = model_dir.joinpath(*parts)
    if not parts or not path.is_file():
        raise ArchiveError(f"{source}: the manifest names configFile {config_file!r} but the archive has no such file")
    raw = _read_bytes(path, source, limit=MAX_MODEL_CONFIG_BYTES)
    try:
        return load_model_yaml(raw, where=f"{source}: {config_file}")
    except ConfigError as exc:
        raise ArchiveError(str(exc)) from None
