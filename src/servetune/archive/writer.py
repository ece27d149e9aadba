"""Write model archives in torch-model-archiver 0.12's format.

Every artifact lands at the archive root under its basename (an extra-files directory contributes its
contents), ``MAR-INF/MANIFEST.json`` describes the model, and four layouts are offered: ``default``
(deflated zip ``<name>.mar``), ``zip-store`` (stored zip), ``tgz`` (``<name>.tar.gz``, entries under
``<name>/``) and ``no-archive`` (a directory ``<export>/<name>/``). The output appears whole or not at all.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

from servetune._exceptions import ArchiveError
from servetune.archive.manifest import MANIFEST_PATH, RUNTIMES, Manifest, ManifestModel, validate_model_name
from servetune.archive.pt2 import inspect_pt2, is_pt2

__all__ = ["ARCHIVER_VERSION", "ARCHIVE_FORMATS", "BUILTIN_HANDLERS", "archive_path", "create_archive"]

logger = logging.getLogger(__name__)

# The archiver version written into manifests: the torch-model-archiver release whose format this matches.
ARCHIVER_VERSION = "0.12.0"
# format -> file suffix, as in torch-model-archiver's archiving_options
ARCHIVE_FORMATS: dict[str, str] = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}
# TorchServe's default handlers (named, not copied) for the python runtimes, and for the LSP (C++) runtime.
BUILTIN_HANDLERS = (
    "base_handler",
    "text_classifier",
    "image_classifier",
    "object_detector",
    "image_segmenter",
    "dali_image_classifier",
    "vllm_handler",
    "trt_llm_handler",
)
LSP_BUILTIN_HANDLERS = ("BaseHandler", "TorchScriptHandler")
# torch-model-archiver leaves these directories out, and any directory whose name starts with "."
_SKIPPED_DIRS = frozenset({"__MACOSX", "__pycache__"})

PathArg = str | os.PathLike[str]


def archive_path(export_path: PathArg, model_name: str, archive_format: str = "default") -> Path:
    """Where :func:`create_archive` writes ``model_name`` in ``archive_format``."""
    if archive_format not in ARCHIVE_FORMATS:
        raise ArchiveError(f"archive_format must be one of {', '.join(ARCHIVE_FORMATS)}, got {archive_format!r}")
    return Path(export_path) / f"{model_name}{ARCHIVE_FORMATS[archive_format]}"


def create_archive(
    *,
    model_name: str,
    version: str,
    handler: str,
    export_path: PathArg,
    serialized_file: PathArg | None = None,
    model_file: PathArg | None = None,
    extra_files: Sequence[PathArg] | PathArg = (),
    requirements_file: PathArg | None = None,
    config_file: PathArg | None = None,
    runtime: str = "python",
    archive_format: str = "default",
    force: bool = False,
) -> Path:
    """Write a model archive as ``torch-model-archiver`` would, and return its path.

    ``handler`` is a built-in handler name (stored as is) or a handler file, optionally ``path:function``
    (``.py`` is added when missing; the manifest keeps the basename). A ``.pt2`` ``serialized_file`` (an
    AOTInductor package or a saved ExportedProgram) takes no ``model_file``; the manifest's ``model.pt2`` says what
    it is (format, device, torch version, dynamic dimensions), and a file that is not a readable ``.pt2`` is
    refused. ``extra_files`` items may be files,
    directories (their contents are copied) or glob patterns; a single string is split on commas.
    """
    validate_model_name(model_name)
    if not isinstance(version, str) or not version:
        raise ArchiveError(f"version must be a non-empty string, got {version!r}")
    if runtime not in RUNTIMES:
        raise ArchiveError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    out = archive_path(export_path, model_name, archive_format)
    if not out.parent.is_dir():
        raise ArchiveError(f"export path {str(out.parent)!r} is not a directory")
    if (out.exists() or out.is_symlink()) and not force:
        raise ArchiveError(f"{out} already exists; use --force (force=True) to overwrite it")

    extra: dict[str, Any] = {}
    if serialized_file and is_pt2(serialized_file):
        if model_file:
            raise ArchiveError(
                f"serialized_file {os.path.basename(serialized_file)!r} is a .pt2 (a whole exported or compiled "
                "model): it takes no model_file; put Python files the handler imports in extra_files"
            )
        if not os.path.isfile(serialized_file):
            raise ArchiveError(f"serialized_file: {str(serialized_file)!r} is not a file")
        extra["pt2"] = inspect_pt2(serialized_file).to_json()  # what it is, for describe and for people
    model = ManifestModel(
        model_name=model_name,
        serialized_file=os.path.basename(serialized_file) if serialized_file else None,
        handler=os.path.basename(handler),
        model_file=os.path.basename(model_file) if model_file else None,
        model_version=version,
        requirements_file=os.path.basename(requirements_file) if requirements_file else None,
        config_file=os.path.basename(config_file) if config_file else None,
        extra=extra,
    )
    manifest = Manifest.create(model, runtime=runtime, archiver_version=ARCHIVER_VERSION)

    with tempfile.TemporaryDirectory(prefix=f"servetune-archive-{model_name}-") as tmp:
        staging = Path(tmp)
        # Same order as torch-model-archiver, so a later file of the same basename wins the same way.
        for arg, path in (("model_file", model_file), ("serialized_file", serialized_file)):
            _copy_file(arg, path, staging)
        _copy_file("handler", _handler_file(handler, runtime), staging)
        for item in _extra_items(extra_files):
            _copy_extra(item, staging)
        for arg, path in (("requirements_file", requirements_file), ("config_file", config_file)):
            _copy_file(arg, path, staging)
        try:
            _write(out, archive_format, model_name, staging, manifest.to_json())
        except OSError as exc:
            raise ArchiveError(f"cannot write {out}: {exc}") from exc
    return out


def _handler_file(handler: str, runtime: str) -> str | None:
    if not isinstance(handler, str) or not handler:
        raise ArchiveError(f"handler must be a built-in handler name or a file path, got {handler!r}")
    if runtime == "LSP":
        if handler in LSP_BUILTIN_HANDLERS:
            return None
        suffix = ".so" if sys.platform.startswith("linux") else ".dylib" if sys.platform == "darwin" else ""
        return handler.split(":", 1)[0] + suffix
    if handler in BUILTIN_HANDLERS:
        return None
    path = handler.split(":", 1)[0]  # "file:function" names an entry point inside the file
    return path if ".py" in handler else path + ".py"


def _copy_file(arg: str, path: PathArg | None, staging: Path) -> None:
    if not path:
        return
    if not os.path.isfile(path):
        hint = f" (or one of the built-in handlers: {', '.join(BUILTIN_HANDLERS)})" if arg == "handler" else ""
        raise ArchiveError(f"{arg}: {str(path)!r} is not a file{hint}")
    shutil.copy(path, staging)


def _extra_items(extra_files: Sequence[PathArg] | PathArg) -> Iterator[str]:
    if isinstance(extra_files, str):
        # torch-model-archiver checks " b.txt" (after "a.txt, b.txt" is split) unstripped and fails; strip it.
        yield from (item.strip() for item in extra_files.split(",") if item.strip())
    elif isinstance(extra_files, os.PathLike):
        yield os.fspath(extra_files)
    else:
        yield from (os.fspath(item) for item in extra_files)


def _copy_extra(item: str, staging: Path) -> None:
    wildcard = "*" in item or "?" in item or ("[" in item and "]" in item)
    if not wildcard and not os.path.exists(item):
        raise ArchiveError(f"extra file {item!r} does not exist")
    matches = sorted(glob.glob(item))
    if wildcard and not matches:
        logger.warning("extra files pattern %r matched no file", item)
    try:
        for match in matches:
            if os.path.isfile(match):
                shutil.copy2(match, staging)
            elif os.path.isdir(match):
                for name in sorted(os.listdir(match)):
                    src = os.path.join(match, name)
                    if os.path.isfile(src):
                        shutil.copy2(src, staging / name)
                    elif os.path.isdir(src):
                        shutil.copytree(src, staging / name, dirs_exist_ok=True)
            else:
                raise ArchiveError(f"extra file {match!r} is neither a file nor a directory")
    except (OSError, shutil.Error) as exc:
        raise ArchiveError(f"cannot copy extra file {item!r}: {exc}") from exc


def _members(staging: Path) -> Iterator[tuple[Path, str]]:
    """(file, archive name) for every staged file, torch-model-archiver's directory filter applied."""
    for root, dirs, files in os.walk(staging):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(files):
            path = Path(root, name)
            arcname = path.relative_to(staging).as_posix()
            if arcname == MANIFEST_PATH:
                logger.warning("extra files hold a %s; the generated one replaces it", MANIFEST_PATH)
                continue
            yield path, arcname


def _write(out: Path, archive_format: str, model_name: str, staging: Path, manifest: str) -> None:
    if archive_format == "no-archive":
        tree = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial"))
        try:
            tree.chmod(0o755)
            for path, arcname in _members(staging):
                (tree / arcname).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, tree / arcname)
            (tree / MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
            (tree / MANIFEST_PATH).write_text(manifest, encoding="utf-8")
            if out.is_dir() and not out.is_symlink():
                shutil.rmtree(out)
            elif out.exists() or out.is_symlink():
                out.unlink()
            tree.rename(out)
        except BaseException:
            shutil.rmtree(tree, ignore_errors=True)
            raise
        return

    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if archive_format == "tgz":
            with tarfile.open(tmp, "w:gz") as tf:
                for path, arcname in _members(staging):
                    tf.add(path, arcname=f"{model_name}/{arcname}", recursive=False)
                data = manifest.encode("utf-8")
                info = tarfile.TarInfo(f"{model_name}/{MANIFEST_PATH}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
                tf.addfile(info, BytesIO(data))
        else:
            compression = zipfile.ZIP_STORED if archive_format == "zip-store" else zipfile.ZIP_DEFLATED
            with zipfile.ZipFile(tmp, "w", compression) as zf:
                for path, arcname in _members(staging):
                    zf.write(path, arcname)
                zf.writestr(MANIFEST_PATH, manifest)
        tmp.chmod(0o644)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
