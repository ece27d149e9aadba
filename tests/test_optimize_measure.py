"""In-process measurement of variants and the variant table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from rich.console import Console
from torch import nn

from servetune.optimize import VARIANTS, Stage, Variant
from servetune.optimize.measure import measure_variants, median_latency_ms
from servetune.optimize.report import results_json, variant_table

CPU = torch.device("cpu")


class Doubled(Variant):
    """A broken variant for the table: twice eager's answer."""

    name = "doubled"
    kind = "backend"

    def apply(self, stage: Stage) -> None:
        module = stage.module()
        stage.runner = lambda *inputs: module(*inputs) * 2


def test_measure_variants_times_what_applies_and_reports_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(VARIANTS, "doubled", f"{__name__}:Doubled")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    results = measure_variants(
        ["bf16", "channels_last", "doubled", "eager"],
        model,
        device=CPU,
        make_inputs=lambda batch: (torch.randn(batch, 16),),
        batch_sizes=(1, 4),
        repeat=3,
        warmup=1,
    )
    by_name = {r.variant: r for r in results}
    assert results[0].variant == "eager"  # the baseline goes first
    eager, bf16 = by_name["eager"], by_name["bf16"]
    assert eager.status == bf16.status == "ok"
    assert set(bf16.latency_ms) == {1, 4} and all(ms > 0 for ms in bf16.latency_ms.values())
    assert eager.speedup(eager, 4) == 1.0
    assert bf16.speedup(eager, 4) == pytest.approx(eager.latency_ms[4] / bf16.latency_ms[4])
    assert bf16.artifact_mib is not None and eager.artifact_mib is not None
    assert bf16.artifact_mib < eager.artifact_mib  # bfloat16 weights take half the bytes
    assert by_name["channels_last"].status == "n/a" and by_name["channels_last"].latency_ms == {}
    doubled = by_name["doubled"]
    assert doubled.status == "parity" and doubled.parity is not None and not doubled.parity.passed
    assert doubled.reason is not None and "max abs error" in doubled.reason

    console = Console(width=200, record=True)
    console.print(variant_table(results, (1, 4), title="mlp"))
    text = console.export_text()
    assert "rejected: " in text and "no: the model has no 2-D convolution" in text and "(1.00x)" in text
    assert json.loads(json.dumps(results_json(results), default=str))[0]["variant"] == "eager"


def test_median_latency_and_peak_memory() -> None:
    calls: list[int] = []
    assert median_latency_ms(lambda x: calls.append(1), (None,), CPU, repeat=5, warmup=2) >= 0.0
    assert len(calls) == 7
    # RSS growth is only visible in a process that has not already grown past it (a long pytest run may reuse
    # freed pages), so the 64 MiB block is measured in a fresh interpreter.
    code = (
        "import torch; from servetune.optimize.measure import peak_memory\n"
        "with peak_memory(torch.device('cpu')) as peak:\n"
        "    block = torch.ones(64, 2**20, dtype=torch.uint8)\n"
        "    print(peak())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert float(out.stdout.strip().splitlines()[-1]) > 32


def test_interleaved_timing_goes_round_robin_after_converting_everything() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))
    said: list[str] = []
    results = measure_variants(
        ["torchscript", "eager", "fp16"],
        model,
        device=CPU,
        make_inputs=lambda batch: (torch.randn(batch, 8),),
        batch_sizes=(2,),
        repeat=4,
        warmup=1,
        interleave=True,
        progress=said.append,
    )
    assert [r.variant for r in results] == ["eager", "torchscript", "fp16"]
    assert [r.status for r in results] == ["ok", "ok", "n/a"]
    assert all(r.latency_ms[2] > 0 and r.peak_mib is not None for r in results[:2])
    assert said == [
        "eager: converting, checking parity",
        "torchscript: converting, checking parity",
        "fp16: converting, checking parity",
        "timing 2 variants round-robin at batch 2",
    ]
