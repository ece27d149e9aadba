"""``servetune optimize ARCHIVE``: real archives built with servetune's archiver, the real command."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from servetune.archive import create_archive
from servetune.cli import cli
from servetune.cli.optimize import artifacts_dir

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class SmallCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.head = nn.Linear(8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x).mean(dim=(2, 3)))
    """
)


def eager_archive(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "small_cnn.py").write_text(MODEL_FILE)
    namespace: dict[str, object] = {}
    exec(compile(MODEL_FILE, "small_cnn", "exec"), namespace)
    torch.manual_seed(0)
    torch.save(namespace["SmallCNN"]().state_dict(), src / "weights.pt")  # type: ignore[operator]
    (src / "model-config.yaml").write_text("input_shape: [3, 16, 16]\n")
    return create_archive(
        model_name="small",
        version="1.0",
        handler="image_classifier",
        export_path=tmp_path,
        serialized_file=src / "weights.pt",
        model_file=src / "small_cnn.py",
        config_file=src / "model-config.yaml",
    )


def run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["optimize", *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_optimize_prints_the_variant_table_and_writes_artifacts(tmp_path: Path) -> None:
    archive = eager_archive(tmp_path)
    out_json = tmp_path / "results.json"
    args = [str(archive), "--variants", "torchscript,onnx,fp16,channels_last+bf16", "--batch-sizes", "1,2"]
    code, output = run([*args, "--repeat", "2", "--warmup", "1", "--write", "--interleave", "--json", str(out_json)])
    assert code == 0, output
    assert "(1.00x)" in output and "fp16 needs a CUDA device" in output
    rows = {row["variant"]: row for row in json.loads(out_json.read_text())}
    assert list(rows) == ["eager", "torchscript", "onnx", "fp16", "channels_last+bf16"]  # eager first, added
    for name in ("eager", "torchscript", "onnx", "channels_last+bf16"):
        row = rows[name]
        assert row["status"] == "ok", row
        assert set(row["latency_ms"]) == {"1", "2"} and all(ms > 0 for ms in row["latency_ms"].values())
        assert row["parity"]["failures"] == [] and row["parity"]["top1_agreement"] == 1.0
        assert row["artifact_mib"] > 0 and row["convert_s"] > 0
    assert rows["fp16"]["status"] == "n/a" and rows["fp16"]["latency_ms"] == {}
    written = sorted(p.suffix for p in artifacts_dir(archive).iterdir())
    assert written == [".onnx", ".pt"]
    assert rows["onnx"]["artifact"].startswith(str(artifacts_dir(archive)))


def test_optimize_a_torchscript_archive(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    with pytest.warns(FutureWarning):  # torch.jit is deprecated, .mar archives are full of it
        traced = torch.jit.trace(model, (torch.rand(1, 3, 8, 8),))  # type: ignore[no-untyped-call]
        traced.save(str(tmp_path / "model.pt"))
    (tmp_path / "model-config.yaml").write_text("input_shape: [3, 8, 8]\n")
    archive = create_archive(
        model_name="ts",
        version="1.0",
        handler="image_classifier",
        export_path=tmp_path,
        serialized_file=tmp_path / "model.pt",
        config_file=tmp_path / "model-config.yaml",
    )
    out_json = tmp_path / "results.json"
    code, output = run(
        [str(archive), "--variants", "eager,int8-dynamic,torchscript", "--repeat", "1", "--json", str(out_json)]
    )
    assert code == 0, output
    rows = {row["variant"]: row for row in json.loads(out_json.read_text())}
    assert rows["eager"]["status"] == "ok" and rows["torchscript"]["status"] == "ok"
    assert rows["int8-dynamic"]["status"] == "n/a"
    assert "cannot be quantized" in rows["int8-dynamic"]["reason"]
    assert not artifacts_dir(archive).exists()  # without --write nothing lands beside the archive


def test_bad_arguments_fail_before_loading(tmp_path: Path) -> None:
    archive = eager_archive(tmp_path)
    code, output = run([str(archive), "--batch-sizes", "1,x"])
    assert code == 2 and "expected comma-separated integers" in output
    proc = subprocess.run(
        [sys.executable, "-m", "servetune", "optimize", str(archive), "--variants", "eager,fp16+bf16"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "'fp16' and 'bf16' are both precision variants" in proc.stderr
