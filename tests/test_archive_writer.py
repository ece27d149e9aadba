from __future__ import annotations

import json
import logging
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from servetune._exceptions import ArchiveError
from servetune.archive import create_archive, open_archive

HANDLER = "def handle(data, context):\n    return data\n"


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    """A model's source files, with the extras torch-model-archiver filters and flattens."""
    s = tmp_path / "src"
    (s / "nested" / "code").mkdir(parents=True)
    (s / "echo_handler.py").write_text(HANDLER)
    (s / "weights.bin").write_bytes(bytes(range(256)) * 4)
    (s / "model.py").write_text("class Net: ...\n")
    (s / "requirements.txt").write_text("numpy\n")
    (s / "model-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 50\n")
    (s / "index_to_name.json").write_text('{"0": "cat"}')
    assets = s / "assets"
    for sub in ("sub", ".git", "__pycache__", "sub/__MACOSX"):
        (assets / sub).mkdir(parents=True)
    (assets / "vocab.txt").write_text("a\nb\n")
    (assets / ".hidden_file").write_text("kept")
    (assets / "sub" / "deep.txt").write_text("deep")
    (assets / ".git" / "HEAD").write_text("skipped")
    (assets / "__pycache__" / "x.pyc").write_bytes(b"skipped")
    (assets / "sub" / "__MACOSX" / "junk").write_text("skipped")
    (s / "nested" / "code" / "util.py").write_text("X = 1\n")
    return s


EXPECTED = {
    "echo_handler.py",
    "weights.bin",
    "model.py",
    "requirements.txt",
    "model-config.yaml",
    "index_to_name.json",
    "vocab.txt",
    ".hidden_file",
    "sub/deep.txt",
    "util.py",
    "MAR-INF/MANIFEST.json",
}


def build(src: Path, out: Path, archive_format: str = "default", **kw: object) -> Path:
    out.mkdir(exist_ok=True)
    args: dict[str, object] = {
        "model_name": "echo",
        "version": "1.0",
        "handler": str(src / "echo_handler.py"),
        "export_path": out,
        "serialized_file": src / "weights.bin",
        "model_file": str(src / "model.py"),
        "extra_files": [str(src / "index_to_name.json"), src / "assets", str(src / "nested" / "*" / "*.py")],
        "requirements_file": src / "requirements.txt",
        "config_file": src / "model-config.yaml",
        "archive_format": archive_format,
    }
    args.update(kw)
    return create_archive(**args)  # type: ignore[arg-type]


def files_of(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("archive_format", "filename"),
    [("default", "echo.mar"), ("zip-store", "echo.mar"), ("tgz", "echo.tar.gz"), ("no-archive", "echo")],
)
def test_round_trip_of_each_format(src: Path, tmp_path: Path, archive_format: str, filename: str) -> None:
    path = build(src, tmp_path / "out", archive_format)
    assert path == tmp_path / "out" / filename and path.exists()
    assert {p.name for p in (tmp_path / "out").iterdir()} == {filename}  # no leftovers from staging
    archive = open_archive(path, tmp_path / "x")
    assert files_of(archive.model_dir) == EXPECTED
    assert archive.extracted is (archive_format != "no-archive")
    assert (archive.model_dir / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
    assert (archive.model_dir / "sub" / "deep.txt").read_text() == "deep"
    m = archive.manifest
    assert m.to_dict()["model"] == {
        "modelName": "echo",
        "serializedFile": "weights.bin",
        "handler": "echo_handler.py",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "requirementsFile": "requirements.txt",
        "configFile": "model-config.yaml",
    }
    assert (m.runtime, m.archiver_version) == ("python", "0.12.0")
    assert list(m.raw) == ["createdOn", "runtime", "model", "archiverVersion"]
    assert archive.model_config == {"batchSize": 4, "maxBatchDelay": 50}


def test_zip_layout_and_compression(src: Path, tmp_path: Path) -> None:
    for fmt, method in (("default", zipfile.ZIP_DEFLATED), ("zip-store", zipfile.ZIP_STORED)):
        out = tmp_path / fmt
        with zipfile.ZipFile(build(src, out, fmt)) as zf:
            assert set(zf.namelist()) == EXPECTED  # flat, no directory entries
            assert {i.compress_type for i in zf.infolist()} == {method}
            assert zf.namelist()[-1] == "MAR-INF/MANIFEST.json"
            assert json.loads(zf.read("MAR-INF/MANIFEST.json"))["model"]["modelName"] == "echo"


def test_tgz_puts_everything_under_the_model_name(src: Path, tmp_path: Path) -> None:
    with tarfile.open(build(src, tmp_path / "out", "tgz"), "r:gz") as tf:
        assert {m.name for m in tf.getmembers()} == {f"echo/{n}" for n in EXPECTED}
        assert all(m.isreg() for m in tf.getmembers())


def test_builtin_handler_is_named_not_copied(src: Path, tmp_path: Path) -> None:
    path = build(src, tmp_path / "out", handler="image_classifier", extra_files=())
    archive = open_archive(path, tmp_path / "x")
    assert archive.manifest.model.handler == "image_classifier"
    assert files_of(archive.model_dir) == {
        "weights.bin", "model.py", "requirements.txt", "model-config.yaml", "MAR-INF/MANIFEST.json"
    }  # fmt: skip


@pytest.mark.parametrize("spec", ["echo_handler:handle", "echo_handler.py:handle", "echo_handler"])
def test_handler_entry_point_forms(src: Path, tmp_path: Path, spec: str) -> None:
    path = build(src, tmp_path / "out", handler=str(src / spec), extra_files=())
    archive = open_archive(path, tmp_path / "x")
    assert archive.manifest.model.handler == spec
    assert (archive.model_dir / "echo_handler.py").read_text() == HANDLER


def test_extra_files_as_a_comma_separated_string(src: Path, tmp_path: Path) -> None:
    path = build(src, tmp_path / "out", extra_files=f"{src / 'index_to_name.json'}, {src / 'assets'}")
    names = set(zipfile.ZipFile(path).namelist())
    assert {"index_to_name.json", "vocab.txt", "sub/deep.txt"} <= names and "util.py" not in names


def test_wildcard_matching_nothing_only_warns(src: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="servetune.archive.writer"):
        build(src, tmp_path / "out", extra_files=[str(src / "*.nothing")])
    assert "matched no file" in caplog.text


def test_existing_output_needs_force(src: Path, tmp_path: Path) -> None:
    for fmt in ("default", "tgz", "no-archive"):
        first = build(src, tmp_path / "out", fmt)
        stamp = first / "stale.txt" if fmt == "no-archive" else None
        if stamp:
            stamp.write_text("old")
        with pytest.raises(ArchiveError, match="already exists; use --force"):
            build(src, tmp_path / "out", fmt)
        again = build(src, tmp_path / "out", fmt, force=True, version="2.0")
        assert open_archive(again, tmp_path / f"x-{fmt}").manifest.model.model_version == "2.0"
        if stamp:
            assert not stamp.exists()  # the directory is replaced, not copied over


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"model_name": "-bad"}, "invalid model name '-bad'"),
        ({"model_name": "a/b"}, "invalid model name 'a/b'"),
        ({"version": ""}, "version"),
        ({"runtime": "java"}, "runtime must be one of"),
        ({"archive_format": "rar"}, "archive_format must be one of"),
        ({"handler": "no_such_handler"}, "handler: 'no_such_handler.py' is not a file"),
        ({"serialized_file": "missing.pt"}, "serialized_file: 'missing.pt' is not a file"),
        ({"extra_files": ["missing.txt"]}, "extra file 'missing.txt' does not exist"),
    ],
)
def test_bad_arguments_are_archive_errors_naming_the_value(
    src: Path, tmp_path: Path, override: dict[str, object], message: str
) -> None:
    with pytest.raises(ArchiveError, match=message):
        build(src, tmp_path / "out", **override)
    assert list((tmp_path / "out").iterdir()) == []


def test_export_path_must_be_a_directory(src: Path, tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="is not a directory"):
        create_archive(model_name="m", version="1", handler="base_handler", export_path=tmp_path / "nope")


def test_generated_manifest_replaces_one_in_the_extra_files(src: Path, tmp_path: Path) -> None:
    (src / "old" / "MAR-INF").mkdir(parents=True)
    (src / "old" / "MAR-INF" / "MANIFEST.json").write_text('{"model": {"modelName": "stale"}}')
    path = build(src, tmp_path / "out", extra_files=[src / "old"])
    with zipfile.ZipFile(path) as zf:
        assert zf.namelist().count("MAR-INF/MANIFEST.json") == 1
    assert open_archive(path, tmp_path / "x").manifest.model.model_name == "echo"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LSP handlers are .so files on Linux")
def test_lsp_runtime_copies_the_shared_library(src: Path, tmp_path: Path) -> None:
    (src / "libhandler.so").write_bytes(b"\x7fELF")
    path = build(src, tmp_path / "out", runtime="LSP", handler=str(src / "libhandler:Handler"), extra_files=())
    archive = open_archive(path, tmp_path / "x")
    assert archive.manifest.runtime == "LSP" and archive.manifest.model.handler == "libhandler:Handler"
    assert (archive.model_dir / "libhandler.so").exists()
    builtin = build(src, tmp_path / "out2", runtime="LSP", handler="TorchScriptHandler", extra_files=())
    assert "TorchScriptHandler" not in zipfile.ZipFile(builtin).namelist()
