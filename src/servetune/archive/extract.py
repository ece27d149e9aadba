"""Safe extraction of zip (``.mar``) and gzipped tar archives.

TorchServe's own extraction had a Zip Slip hole (CVE-2023-48299). Here every entry is checked before
anything is written: no absolute names, no ``..`` components, no backslashes or NUL bytes, nothing but
regular files and directories (symlinks, hard links, devices and FIFOs are refused), every target must
resolve inside ``dest``, and the total size is bounded twice: by the sizes the archive declares and by the
bytes actually written, because a zip bomb lies about its sizes.
"""

from __future__ import annotations

import gzip
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from servetune._exceptions import ArchiveError

__all__ = ["extract_tar_gz", "extract_zip", "safe_parts"]

_CHUNK = 1 << 16  # as shutil.copyfileobj; larger reads make ZipExtFile slower, not faster


def safe_parts(name: str, *, archive: Path) -> list[str]:
    """Split an entry name into path components, or raise ArchiveError if it could escape the destination."""

    def refuse(why: str) -> ArchiveError:
        return ArchiveError(f"{archive}: unsafe entry {name!r}: {why}")

    if not name:
        raise refuse("empty name")
    if "\x00" in name:
        raise refuse("NUL byte in name")
    if "\\" in name:
        raise refuse("backslash in name")
    if name.startswith("/"):
        raise refuse("absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise refuse("'..' component")
    if parts and len(parts[0]) >= 2 and parts[0][1] == ":" and parts[0][0].isalpha():
        raise refuse("drive letter")
    return parts


class _Sink:
    """Writes entries under ``dest``, counting every byte against the limit."""

    def __init__(self, archive: Path, dest: Path, limit: int) -> None:
        self.archive = archive
        self.root = os.path.realpath(dest)
        self.limit = limit
        self.written = 0

    def target(self, name: str, parts: list[str]) -> str:
        path = os.path.join(self.root, *parts)
        if os.path.commonpath([self.root, os.path.realpath(path)]) != self.root:
            raise ArchiveError(f"{self.archive}: unsafe entry {name!r}: resolves outside {self.root}")
        return path

    def directory(self, name: str, parts: list[str]) -> None:
        os.makedirs(self.target(name, parts), exist_ok=True)

    def file(self, name: str, parts: list[str], source: IO[bytes], declared: int) -> None:
        path = self.target(name, parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # O_NOFOLLOW: never write through a link, even one that appeared after the check above.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        size = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(_CHUNK):
                size += len(chunk)
                self.written += len(chunk)
                if size > declared or self.written > self.limit:
                    raise ArchiveError(
                        f"{self.archive}: entry {name!r} expands past its declared size ({declared} bytes) "
                        f"or the archive past the limit of {self.limit} bytes"
                    )
                out.write(chunk)


def _check_total(archive: Path, name: str, total: int, limit: int) -> None:
    if total > limit:
        raise ArchiveError(
            f"{archive}: uncompressed size exceeds the limit of {limit} bytes (at entry {name!r}, {total} bytes)"
        )


def extract_zip(archive: Path, dest: Path, *, limit: int, max_members: int) -> None:
    """Extract a zip archive into the existing directory ``dest``."""
    name = ""
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > max_members:
                raise ArchiveError(f"{archive}: {len(infos)} entries, more than the limit of {max_members}")
            total = 0
            for info in infos:  # declared sizes first, before writing anything
                name = info.filename
                safe_parts(name, archive=archive)
                total += info.file_size
                _check_total(archive, name, total, limit)
                kind = stat.S_IFMT(info.external_attr >> 16)
                if kind == stat.S_IFLNK:
                    raise ArchiveError(f"{archive}: unsafe entry {name!r}: symbolic link")
                if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise ArchiveError(f"{archive}: unsafe entry {name!r}: special file (mode {kind:o})")
                if info.flag_bits & 0x1:
                    raise ArchiveError(f"{archive}: entry {name!r} is encrypted")
            sink = _Sink(archive, dest, limit)
            for info in infos:
                name = info.filename
                parts = safe_parts(name, archive=archive)
                if info.is_dir():
                    sink.directory(name, parts)
                elif parts:
                    with zf.open(info) as source:
                        sink.file(name, parts, source, info.file_size)
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, OSError) as exc:
        where = f" at entry {name!r}" if name else ""
        raise ArchiveError(f"{archive}: cannot extract zip{where}: {exc}") from exc


def _tar_members(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while (member := tf.next()) is not None:
        yield member


def extract_tar_gz(archive: Path, dest: Path, *, limit: int, max_members: int) -> None:
    """Extract a gzipped tar into ``dest``, dropping each entry's first path component as TorchServe does."""
    name = ""
    try:
        # Stream mode: a member is checked before its data is read, so a bomb is refused without inflating it.
        # gzip.open, not mode "r|gz": tarfile's own gzip reader dies with TypeError on a truncated header.
        with gzip.open(archive, "rb") as gz, tarfile.open(fileobj=gz, mode="r|") as tf:
            sink = _Sink(archive, dest, limit)
            total = 0
            for count, member in enumerate(_tar_members(tf), start=1):
                name = member.name
                if count > max_members:
                    raise ArchiveError(f"{archive}: more entries than the limit of {max_members}")
                safe_parts(name, archive=archive)
                if not (member.isreg() or member.isdir()):
                    kind = "symbolic link" if member.issym() else "hard link" if member.islnk() else "special file"
                    raise ArchiveError(f"{archive}: unsafe entry {name!r}: {kind}")
                total += member.size
                _check_total(archive, name, total, limit)
                # torch-model-archiver puts everything under "<model-name>/"; TorchServe drops the text up to
                # the first "/" (so "./x" becomes "x"). tarfile removes a directory's trailing "/": put it back.
                full = name + "/" if member.isdir() else name
                rest = full.split("/", 1)[1] if "/" in full else full
                parts = [p for p in rest.split("/") if p not in ("", ".")]
                if member.isdir():
                    sink.directory(name, parts)
                elif parts:
                    source = tf.extractfile(member)
                    if source is None:  # pragma: no cover - isreg() members always have data
                        raise ArchiveError(f"{archive}: entry {name!r} has no data")
                    with source:
                        sink.file(name, parts, source, member.size)
    except ArchiveError:
        raise
    except (tarfile.TarError, zlib.error, EOFError, OSError) as exc:
        where = f" at entry {name!r}" if name else ""
        raise ArchiveError(f"{archive}: cannot extract tar.gz{where}: {exc}") from exc
