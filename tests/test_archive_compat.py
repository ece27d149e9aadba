"""Compatibility both ways with the real TorchServe tools.

torch-model-archiver 0.12.0 (pure Python) makes archives that ``open_archive`` must load unchanged, and
``create_archive`` must write what it writes. TorchServe 0.12.0's own Python model loader must load a
servetune-made archive with a torch-free handler. The tools run in subprocesses; tests skip without them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from servetune.archive import create_archive, open_archive

HAVE_ARCHIVER = importlib.util.find_spec("model_archiver") is not None


def _have_torchserve() -> bool:
    # Look for ts/model_loader.py without importing ts (its __init__ leaks a file handle: a ResourceWarning).
    spec = importlib.util.find_spec("ts")
    return spec is not None and any(Path(d, "model_loader.py").is_file() for d in spec.submodule_search_locations or ())


HAVE_TORCHSERVE = _have_torchserve()
needs_archiver = pytest.mark.skipif(
    not HAVE_ARCHIVER, reason="torch-model-archiver is not installed (pip install torch-model-archiver==0.12.0)"
)
needs_torchserve = pytest.mark.skipif(
    not HAVE_TORCHSERVE, reason="torchserve is not installed (pip install torchserve==0.12.0 --no-deps)"
)

HANDLER = textwrap.dedent(
    """
    SEEN = {}

    def handle(data, context):
        if data is None:  # initialisation
            SEEN["manifest"] = context.manifest
            SEEN["yaml"] = context.model_yaml_config
            return None
        return [{"echo": row.get("data"), **SEEN} for row in data]
    """
)
CONFIG = "batchSize: 4\nmaxBatchDelay: 50\nhandler:\n  threshold: 0.5\n"


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    s = tmp_path / "src"
    (s / "assets" / "sub").mkdir(parents=True)
    (s / "assets" / "__pycache__").mkdir()
    (s / "assets" / ".cache").mkdir()
    (s / "echo_handler.py").write_text(HANDLER)
    (s / "weights.bin").write_bytes(os.urandom(4096))
    (s / "model.py").write_text("class Net: ...\n")
    (s / "requirements.txt").write_text("numpy\n")
    (s / "model-config.yaml").write_text(CONFIG)
    (s / "index_to_name.json").write_text('{"0": "cat"}')
    (s / "assets" / "vocab.txt").write_text("a\nb\n")
    (s / "assets" / ".hidden").write_text("kept")
    (s / "assets" / "sub" / "deep.txt").write_text("deep")
    (s / "assets" / "__pycache__" / "x.pyc").write_bytes(b"dropped")
    (s / "assets" / ".cache" / "y").write_text("dropped")
    return s


def inputs(src: Path, handler: str = "echo_handler.py") -> dict[str, Any]:
    return {
        "model_name": "echo",
        "version": "1.0",
        "handler": str(src / handler),
        "serialized_file": str(src / "weights.bin"),
        "model_file": str(src / "model.py"),
        "extra_files": f"{src / 'index_to_name.json'},{src / 'assets'}",
        "requirements_file": str(src / "requirements.txt"),
        "config_file": str(src / "model-config.yaml"),
    }


def run_archiver(args: dict[str, Any], export: Path, archive_format: str, scratch: Path) -> None:
    flags = {"requirements_file": "--requirements-file", "config_file": "--config-file", "version": "--version"}
    argv = [f"{flags.get(k, '--' + k.replace('_', '-'))}={v}" for k, v in args.items()]
    argv += [f"--export-path={export}", f"--archive-format={archive_format}"]
    code = "from model_archiver.model_packaging import generate_model_archive; generate_model_archive()"
    # It stages in $TMPDIR/<model-name> and deletes that folder first: give it a private TMPDIR.
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def contents(path: Path, archive_format: str) -> dict[str, bytes]:
    """Member name -> bytes, whatever the layout."""
    if archive_format == "tgz":
        with tarfile.open(path, "r:gz") as tf:
            return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isreg()}  # type: ignore[union-attr]
    if archive_format == "no-archive":
        return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def without_date(files: dict[str, bytes]) -> dict[str, Any]:
    out: dict[str, Any] = dict(files)
    for name, data in files.items():
        if name.endswith("MAR-INF/MANIFEST.json"):
            manifest = json.loads(data)
            assert manifest.pop("createdOn")
            out[name] = manifest
    return out


FORMATS = [("default", "echo.mar"), ("zip-store", "echo.mar"), ("tgz", "echo.tar.gz"), ("no-archive", "echo")]


@needs_archiver
@pytest.mark.parametrize(("archive_format", "filename"), FORMATS)
def test_open_archive_loads_torch_model_archiver_output(
    src: Path, tmp_path: Path, archive_format: str, filename: str
) -> None:
    (tmp_path / "tma").mkdir()
    (tmp_path / "scratch").mkdir()
    run_archiver(inputs(src), tmp_path / "tma", archive_format, tmp_path / "scratch")
    made = tmp_path / "tma" / filename
    raw = contents(made, archive_format)
    manifest = json.loads(raw[next(n for n in raw if n.endswith("MAR-INF/MANIFEST.json"))])

    archive = open_archive(made, tmp_path / "x")
    assert archive.manifest.raw == manifest  # unchanged, every key
    assert archive.manifest.to_dict() == manifest
    assert archive.manifest.model.handler == "echo_handler.py"
    assert archive.model_config == yaml.safe_load(CONFIG)
    prefix = "echo/" if archive_format == "tgz" else ""
    files = (p for p in archive.model_dir.rglob("*") if p.is_file())
    extracted = {p.relative_to(archive.model_dir).as_posix(): p.read_bytes() for p in files}
    assert extracted == {name.removeprefix(prefix): data for name, data in raw.items()}
    assert "sub/deep.txt" in extracted and ".hidden" in extracted and "x.pyc" not in extracted


@needs_archiver
@pytest.mark.parametrize(("archive_format", "filename"), FORMATS)
@pytest.mark.parametrize("handler", ["echo_handler.py", "echo_handler:handle"])
def test_create_archive_writes_what_torch_model_archiver_writes(
    src: Path, tmp_path: Path, archive_format: str, filename: str, handler: str
) -> None:
    for d in ("tma", "ours", "scratch"):
        (tmp_path / d).mkdir()
    run_archiver(inputs(src, handler), tmp_path / "tma", archive_format, tmp_path / "scratch")
    ours = create_archive(**inputs(src, handler), export_path=tmp_path / "ours", archive_format=archive_format)
    assert ours.name == filename
    theirs, mine = contents(tmp_path / "tma" / filename, archive_format), contents(ours, archive_format)
    assert without_date(mine) == without_date(theirs)
    if archive_format in ("default", "zip-store"):
        with zipfile.ZipFile(tmp_path / "tma" / filename) as a, zipfile.ZipFile(ours) as b:
            assert {i.filename: i.compress_type for i in a.infolist()} == {
                i.filename: i.compress_type for i in b.infolist()
            }
            manifest_text = a.read("MAR-INF/MANIFEST.json").decode()
            # Same JSON text apart from the date: indent=2, same key order.
            assert b.read("MAR-INF/MANIFEST.json").decode().splitlines()[2:] == manifest_text.splitlines()[2:]


TS_LOAD = textwrap.dedent(
    """
    import json, sys
    model_dir, handler = sys.argv[1], sys.argv[2]
    sys.path.insert(0, model_dir)  # the TorchServe worker puts the model dir on sys.path
    from ts.model_loader import ModelLoaderFactory
    service = ModelLoaderFactory.get_model_loader().load("echo", model_dir, handler, None, 1)
    result = service._entry_point([{"data": "ping"}], service.context)
    print(json.dumps({"result": result, "model_dir": service.context.system_properties["model_dir"]}))
    """
)


@needs_torchserve
@pytest.mark.slow
@pytest.mark.parametrize(
    ("archive_format", "handler"), [("default", "echo_handler.py"), ("tgz", "echo_handler:handle")]
)
def test_torchserve_model_loader_accepts_our_archive(
    src: Path, tmp_path: Path, archive_format: str, handler: str
) -> None:
    (tmp_path / "out").mkdir()
    path = create_archive(**inputs(src, handler), export_path=tmp_path / "out", archive_format=archive_format)
    archive = open_archive(path, tmp_path / "model")
    done = subprocess.run(
        [sys.executable, "-c", TS_LOAD, str(archive.model_dir), archive.manifest.model.handler or ""],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["model_dir"] == str(archive.model_dir)
    [row] = answer["result"]
    assert row["echo"] == "ping"
    assert row["manifest"] == archive.manifest.raw  # TorchServe's context.manifest is our manifest.raw
    assert row["yaml"] == archive.model_config  # and its model_yaml_config our model_config
