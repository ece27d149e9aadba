"""Measure variants in-process: conversion time, parity, median latency per batch size, peak memory, artifact size.

Latency is the median of ``repeat`` timed calls after ``warmup`` untimed ones, through the :class:`VariantModel`
(input conversion included, as a handler pays it). Peak memory is the CUDA allocator's peak on a CUDA device, and
otherwise the peak of the process's resident set size, sampled every few milliseconds, over its size before the
conversion: memory the allocator kept from an earlier variant is not counted again, so run one variant alone for
a clean figure.
"""

from __future__ import annotations

import io
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from servetune.optimize._tree import ModelInputs
from servetune.optimize.apply import apply_variant
from servetune.optimize.base import VariantModel
from servetune.optimize.errors import ParityError, VariantNotApplicable
from servetune.optimize.parity import ParityReport, Tolerance

InputMaker = Callable[[int], ModelInputs]
"""Builds the positional arguments of one model call for a given batch size, on the device."""


@dataclass
class VariantResult:
    """One row of the variant table."""

    variant: str
    status: str  # "ok", "n/a" (does not apply) or "parity" (rejected: outside tolerance)
    reason: str | None = None
    parity: ParityReport | None = None
    convert_s: float | None = None
    latency_ms: dict[int, float] = field(default_factory=dict)
    peak_mib: float | None = None
    artifact_mib: float | None = None
    artifact: str | None = None
    notes: list[str] = field(default_factory=list)

    def speedup(self, eager: VariantResult, batch: int) -> float | None:
        """Eager's latency over this variant's at ``batch`` (2.0 = twice as fast)."""
        mine, base = self.latency_ms.get(batch), eager.latency_ms.get(batch)
        return base / mine if mine and base else None


@contextmanager
def peak_memory(device: torch.device) -> Iterator[Callable[[], float]]:
    """Yield a function giving the peak memory growth, in MiB, since the block started."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield lambda: (torch.cuda.max_memory_allocated(device) - start) / 2**20
        return
    process = psutil.Process()
    start = process.memory_info().rss
    peak = [start]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, name="servetune-rss-sampler", daemon=True)
    sampler.start()
    try:
        yield lambda: (max(peak[0], process.memory_info().rss) - start) / 2**20
    finally:
        stop.set()
        sampler.join()


def median_latency_ms(
    model: Callable[..., Any], inputs: ModelInputs, device: torch.device, repeat: int, warmup: int
) -> float:
    """Median wall time of one call, in milliseconds."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        model(*inputs)
    sync()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        model(*inputs)
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000.0


def serialized_bytes(model: VariantModel) -> int | None:
    """The variant's artifact size, else the size of its weights as ``torch.save`` writes them."""
    if model.artifact_bytes is not None:
        return model.artifact_bytes
    if not isinstance(model.runner, nn.Module):
        return None
    buffer = io.BytesIO()
    torch.save(model.runner.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def _convert(
    name: str,
    model: nn.Module,
    device: torch.device,
    make_inputs: InputMaker,
    cache_dir: Path | None,
    tolerance: Tolerance | Mapping[str, float] | None,
    max_batch: int | None = None,
) -> tuple[VariantResult, VariantModel | None]:
    try:
        variant = apply_variant(
            name,
            model,
            device=device,
            example_inputs=make_inputs(2),
            cache_dir=cache_dir,
            tolerance=tolerance,
            max_batch=max_batch,
        )
    except VariantNotApplicable as exc:
        return VariantResult(exc.variant, "n/a", reason=exc.reason), None
    except ParityError as exc:
        report = exc.report
        return VariantResult(report.variant, "parity", reason="; ".join(report.failures), parity=report), None
    size = serialized_bytes(variant)
    result = VariantResult(
        variant.variant,
        "ok",
        parity=variant.parity,
        convert_s=variant.convert_seconds,
        artifact_mib=size / 2**20 if size is not None else None,
        artifact=str(variant.artifact) if variant.artifact is not None else None,
        notes=variant.notes,
    )
    return result, variant


def measure_variant(
    name: str,
    model: nn.Module,
    *,
    device: torch.device,
    make_inputs: InputMaker,
    batch_sizes: Sequence[int] = (1, 8),
    repeat: int = 20,
    warmup: int = 3,
    cache_dir: Path | None = None,
    tolerance: Tolerance | Mapping[str, float] | None = None,
    max_batch: int | None = None,
) -> VariantResult:
    """Apply ``name`` to ``model`` (example inputs: ``make_inputs(2)``) and, when it applies, time it.
    Peak memory covers the conversion, the parity check and the timed calls. ``max_batch``: the exported variants'
    batch bound (default: the largest of ``batch_sizes``)."""
    with peak_memory(device) as peak:
        bound = max_batch or max(batch_sizes, default=None)
        result, variant = _convert(name, model, device, make_inputs, cache_dir, tolerance, bound)
        if variant is not None:
            for batch in batch_sizes:
                result.latency_ms[batch] = median_latency_ms(variant, make_inputs(batch), device, repeat, warmup)
            result.peak_mib = max(0.0, peak())
    return result


def measure_variants(
    names: Sequence[str],
    model: nn.Module,
    *,
    device: torch.device,
    make_inputs: InputMaker,
    batch_sizes: Sequence[int] = (1, 8),
    repeat: int = 20,
    warmup: int = 3,
    cache_dir: Path | None = None,
    tolerance: Tolerance | Mapping[str, float] | None = None,
    interleave: bool = False,
    progress: Callable[[str], None] | None = None,
    max_batch: int | None = None,
) -> list[VariantResult]:
    """Measure each variant, eager first (the baseline).

    One after the other by default. With ``interleave`` every variant is converted first (all are held in memory at
    once; peak memory then covers conversion and parity only), and the timed calls go round-robin, one call of each
    variant per round: a machine whose load drifts slows every variant alike, and the ratios to eager hold.
    ``max_batch`` bounds the exported variants' dynamic batch (default: the largest of ``batch_sizes``).
    """
    ordered = sorted(names, key=lambda n: n != "eager")
    say = progress or (lambda _: None)
    results: list[VariantResult] = []
    if not interleave:
        for name in ordered:
            say(f"{name}: converting, checking parity, timing")
            results.append(
                measure_variant(
                    name,
                    model,
                    device=device,
                    make_inputs=make_inputs,
                    batch_sizes=batch_sizes,
                    repeat=repeat,
                    warmup=warmup,
                    cache_dir=cache_dir,
                    tolerance=tolerance,
                    max_batch=max_batch,
                )
            )
        return results
    ready: list[tuple[VariantResult, VariantModel]] = []
    for name in ordered:
        say(f"{name}: converting, checking parity")
        with peak_memory(device) as peak:
            bound = max_batch or max(batch_sizes, default=None)
            result, variant = _convert(name, model, device, make_inputs, cache_dir, tolerance, bound)
            if variant is not None:
                result.peak_mib = max(0.0, peak())
                ready.append((result, variant))
        results.append(result)
    for batch in batch_sizes:
        say(f"timing {len(ready)} variants round-robin at batch {batch}")
        inputs = make_inputs(batch)
        for _, variant in ready:
            median_latency_ms(variant, inputs, device, repeat=1, warmup=warmup)  # compiles, warms caches
        times: list[list[float]] = [[] for _ in ready]
        for round_ in range(repeat):
            for k in range(len(ready)):
                index = (k + round_) % len(ready)  # rotate who goes first
                times[index].append(median_latency_ms(ready[index][1], inputs, device, repeat=1, warmup=0))
        for (result, _), samples in zip(ready, times, strict=True):
            result.latency_ms[batch] = statistics.median(samples)
    return results
