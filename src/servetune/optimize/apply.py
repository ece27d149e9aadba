"""``apply_variant``: make a variant of a model, check it against eager, hand it back ready to call."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from servetune.optimize._tree import ModelInputs, flat_tensors, is_structured, rebatch
from servetune.optimize.base import Stage, VariantModel
from servetune.optimize.errors import OptimizeError, ParityError, VariantNotApplicable
from servetune.optimize.parity import ParityReport, Tolerance, compare
from servetune.optimize.registry import resolve


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def parity_samples(example_inputs: ModelInputs) -> list[ModelInputs]:
    """The example, and for batched tensor inputs the example cycled to two more rows (catches a trace or an
    export that baked the batch size in)."""
    samples = [tuple(example_inputs)]
    tensors = flat_tensors(example_inputs)
    if tensors and not is_structured(example_inputs) and all(t.dim() > 0 for t in tensors):
        sizes = {t.shape[0] for t in tensors}
        if len(sizes) == 1:
            samples.append(rebatch(example_inputs, sizes.pop() + 2))
    return samples


def variant_tolerance(name: str, overrides: Tolerance | Mapping[str, float] | None = None) -> Tolerance:
    """The tolerance a variant spec is checked with: its loosest member's defaults, then ``overrides``."""
    if isinstance(overrides, Tolerance):
        return overrides
    tolerance: Tolerance | None = None
    for variant in resolve(name):
        tolerance = variant.tolerance if tolerance is None else tolerance.loosest(variant.tolerance)
    assert tolerance is not None
    return tolerance.override(overrides)


def apply_variant(
    name: str,
    model: nn.Module,
    *,
    device: torch.device,
    example_inputs: ModelInputs | None,
    cache_dir: Path | None = None,
    tolerance: Tolerance | Mapping[str, float] | None = None,
    check: bool = True,
    max_batch: int | None = None,
) -> VariantModel:
    """Convert ``model`` (put in eval mode, otherwise left untouched) into the variant ``name`` on ``device``.

    ``example_inputs`` are the positional arguments of one model call, as the handler gives them (on ``device``).
    They drive tracing and export, and the parity check against eager that runs unless ``check`` is False;
    without them only eager can be checked. ``cache_dir`` keeps converted artifacts (TorchScript, ONNX, ``.pt2``)
    between loads. ``tolerance`` replaces the variant's default tolerance, or overrides some of its fields.
    ``max_batch`` is the largest batch the exported variants (``export``, ``aoti``) must take: their batch dimension
    is dynamic from 1 to it (at least the parity samples' batch).

    Raises ConfigError for a malformed name, VariantNotApplicable (with ``reason``) when the variant cannot apply
    to this model or device or fails to convert, and ParityError (with ``report``) when its answers differ.
    """
    variants = resolve(name)
    canonical = "+".join(variant.name for variant in variants)
    tol = variant_tolerance(canonical, tolerance)
    model.eval()
    example = tuple(example_inputs) if example_inputs is not None else None
    if check and example is None and canonical != "eager":
        raise VariantNotApplicable(canonical, "example inputs are needed to check parity with eager")
    stage = Stage(canonical, model, device, example, cache_dir, max_batch)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # conversion noise goes into the variant's notes, not the caller's log
        for variant in variants:
            reason = variant.check(stage)
            if reason is not None:
                raise VariantNotApplicable(canonical, reason)
            try:
                variant.apply(stage)
            except VariantNotApplicable:
                raise
            except Exception as exc:
                raise VariantNotApplicable(canonical, f"{variant.name} conversion failed: {_one_line(exc)}") from exc
        try:
            result = VariantModel(stage, stage.runner if stage.runner is not None else stage.module(), 0.0)
            if example is not None:
                result(*example)  # the first call: torch.compile compiles here, lazy kernels load
        except Exception as exc:
            raise VariantNotApplicable(canonical, f"fails on the example inputs: {_one_line(exc)}") from exc
        result.convert_seconds = time.perf_counter() - started
        if check and example is not None:
            result.parity = _check(canonical, model, result, parity_samples(example), tol)
    lines = (f"{w.category.__name__}: {(str(w.message).strip().splitlines() or [''])[0][:160]}" for w in caught)
    result.warnings = list(dict.fromkeys(lines))
    return result


def _check(
    name: str, model: nn.Module, candidate: VariantModel, samples: list[ModelInputs], tol: Tolerance
) -> ParityReport:
    with torch.no_grad():
        try:
            references = [model(*sample) for sample in samples]
        except Exception as exc:
            raise OptimizeError(f"the eager model fails on the example inputs: {_one_line(exc)}") from exc
        try:
            candidates = [candidate(*sample) for sample in samples]
        except Exception as exc:
            raise VariantNotApplicable(name, f"fails on the parity samples: {_one_line(exc)}") from exc
    report = compare(name, references, candidates, tol)
    if not report.passed:
        raise ParityError(report)
    return report
