"""``compile`` (torch.compile, inductor) on a small MLP, on CPU. Inductor generates and builds C++ on first call,
which takes tens of seconds on a small machine: hence slow."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from servetune.optimize import VariantNotApplicable, apply_variant


@pytest.mark.slow
def test_compile_matches_eager_and_counts_compilation_in_its_convert_time() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
    variant = apply_variant("compile", model, device=torch.device("cpu"), example_inputs=(torch.randn(4, 16),))
    assert variant.parity is not None and variant.parity.passed
    assert variant.parity.max_abs is not None and variant.parity.max_abs < 1e-4
    assert type(variant.runner).__name__ == "OptimizedModule"
    assert variant.convert_seconds > 0.5  # the first call compiled
    assert variant(torch.randn(6, 16)).shape == (6, 5)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\..*` is deprecated:FutureWarning")
def test_compile_refuses_a_torchscript_module() -> None:
    scripted = torch.jit.trace(nn.Linear(4, 2), (torch.randn(2, 4),))  # type: ignore[no-untyped-call]
    with pytest.raises(VariantNotApplicable, match="torch.compile does not take a TorchScript module"):
        apply_variant("compile", scripted, device=torch.device("cpu"), example_inputs=(torch.randn(2, 4),))
