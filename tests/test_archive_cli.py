from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import click
import pytest

from servetune.archive import open_archive
from servetune.cli import main
from servetune.cli.archive import command


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    (tmp_path / "handler.py").write_text("def handle(data, context):\n    return data\n")
    (tmp_path / "weights.bin").write_bytes(b"\x00\x01")
    (tmp_path / "model-config.yaml").write_text("batchSize: 2\n")
    (tmp_path / "labels.json").write_text("{}")
    return tmp_path


def test_archive_writes_and_prints_the_path(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (model / "out").mkdir()
    main(
        ["archive", "--model-name", "echo", "-v", "2.0", "--handler", str(model / "handler.py"),
         "--serialized-file", str(model / "weights.bin"), "-c", str(model / "model-config.yaml"),
         "--extra-files", f"{model / 'labels.json'}", "--export-path", str(model / "out")]
    )  # fmt: skip
    printed = capsys.readouterr().out.strip()
    assert printed == str(model / "out" / "echo.mar")
    archive = open_archive(Path(printed), model / "x")
    assert archive.manifest.model.model_version == "2.0" and archive.model_config == {"batchSize": 2}
    assert set(zipfile.ZipFile(printed).namelist()) == {
        "handler.py", "weights.bin", "model-config.yaml", "labels.json", "MAR-INF/MANIFEST.json"
    }  # fmt: skip


def test_export_path_defaults_to_the_current_directory(
    model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(model)
    main(["archive", "--model-name", "m", "--version", "1", "--handler", "handler.py", "--archive-format", "tgz"])
    assert capsys.readouterr().out.strip() == str(model / "m.tar.gz")
    with tarfile.open(model / "m.tar.gz") as tf:
        assert sorted(tf.getnames()) == ["m/MAR-INF/MANIFEST.json", "m/handler.py"]


def test_existing_archive_exits_2_and_says_force(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["archive", "--model-name", "m", "-v", "1", "--handler", "image_classifier", "--export-path", str(model)]
    main(args)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert "--force" in capsys.readouterr().err
    main([*args, "-f"])
    assert capsys.readouterr().out.strip() == str(model / "m.mar")


def test_bad_model_name_exits_2_naming_it(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["archive", "--model-name", "bad name", "-v", "1", "--handler", "x", "--export-path", str(model)])
    assert info.value.code == 2 and "'bad name'" in capsys.readouterr().err


def test_every_option_has_help_and_matches_torch_model_archiver() -> None:
    names = {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts}
    assert {
        "--model-name", "--version", "-v", "--serialized-file", "--model-file", "--handler", "--extra-files",
        "--requirements-file", "-r", "--config-file", "-c", "--export-path", "--archive-format", "--runtime",
        "--force", "-f",
    } <= names  # fmt: skip
    assert all(p.help for p in command.params if isinstance(p, click.Option))
    choices = {p.name: p.type.choices for p in command.params if isinstance(p.type, click.Choice)}
    assert list(choices["archive_format"]) == ["default", "zip-store", "tgz", "no-archive"]
    assert list(choices["runtime"]) == ["python", "python3", "LSP"]


def test_servetune_archive_help_from_the_console() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "servetune", "archive", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--model-name", "--archive-format", "--force", "--extra-files"):
        assert re.search(rf"{flag}\b", done.stdout)
