"""Parity: a variant's outputs against eager's on the same sample inputs.

Tensors: max absolute error, and max relative error measured against the reference tensor's largest magnitude
(so near-zero elements do not blow it up); a tensor passes when ``max_abs <= atol + rtol * max|reference|``.
Classifiers (a single 2-D output with more than one column): top-1 agreement. Detectors (a list of dicts with
``boxes``, ``labels``, ``scores``): detections are matched greedily by IoU within a label, and the report gives
the fraction matched, the worst IoU and the largest score difference among matched pairs. Detections scoring
under ``score_floor`` on both sides are not compared: they come and go with the last bit of a score.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from servetune._exceptions import ConfigError
from servetune.optimize._tree import ModelInputs, flat_tensors


@dataclass(frozen=True)
class Tolerance:
    """How far a variant may stray from eager. Larger ``atol``/``rtol``/``max_score_diff`` and smaller ``min_*``
    are looser."""

    atol: float = 1e-5
    rtol: float = 1e-4
    min_top1: float = 1.0
    min_box_iou: float = 0.99
    max_score_diff: float = 1e-3
    min_match: float = 1.0
    score_floor: float = 0.5
    iou_match: float = 0.5

    def loosest(self, other: Tolerance) -> Tolerance:
        """The looser of two tolerances, field by field (a chain is allowed what its loosest member is)."""
        return Tolerance(
            atol=max(self.atol, other.atol),
            rtol=max(self.rtol, other.rtol),
            min_top1=min(self.min_top1, other.min_top1),
            min_box_iou=min(self.min_box_iou, other.min_box_iou),
            max_score_diff=max(self.max_score_diff, other.max_score_diff),
            min_match=min(self.min_match, other.min_match),
            score_floor=max(self.score_floor, other.score_floor),
            iou_match=min(self.iou_match, other.iou_match),
        )

    def override(self, overrides: Mapping[str, float] | None) -> Tolerance:
        """A copy with some fields replaced; an unknown field is a ConfigError naming it."""
        if not overrides:
            return self
        known = {f.name for f in dataclasses.fields(self)}
        for key, value in overrides.items():
            if key not in known:
                raise ConfigError(f"unknown tolerance {key!r}={value!r}; expected one of {sorted(known)}")
            if not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"tolerance {key!r}={value!r}: expected a number >= 0")
        return dataclasses.replace(self, **{key: float(value) for key, value in overrides.items()})


@dataclass(frozen=True)
class ParityReport:
    """The figures of one parity check. A figure is None when no output of that kind was compared."""

    variant: str
    tolerance: Tolerance
    samples: int
    max_abs: float | None = None
    max_rel: float | None = None
    top1_agreement: float | None = None
    box_iou: float | None = None
    score_diff: float | None = None
    match: float | None = None
    failures: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        """The figures on one line, then the failures."""
        parts = []
        for label, value in (
            ("max_abs", self.max_abs),
            ("max_rel", self.max_rel),
            ("top1", self.top1_agreement),
            ("match", self.match),
            ("box_iou", self.box_iou),
            ("score_diff", self.score_diff),
        ):
            if value is not None:
                parts.append(f"{label}={value:.3g}")
        text = " ".join(parts) or "no outputs compared"
        return f"{text}; " + "; ".join(self.failures) if self.failures else text


class _Figures:
    """Figures accumulated over samples and outputs."""

    def __init__(self, tolerance: Tolerance) -> None:
        self.tol = tolerance
        self.max_abs: float | None = None
        self.max_rel: float | None = None
        self.top1 = [0, 0]  # agreeing rows, rows
        self.matched = [0, 0]  # matched detections above the floor, detections above the floor
        self.box_iou: float | None = None
        self.score_diff: float | None = None
        self.images = 0
        self.failures: list[str] = []

    def tensors(self, where: str, reference: torch.Tensor, candidate: torch.Tensor) -> None:
        if reference.shape != candidate.shape:
            self.failures.append(f"{where}: shape {tuple(candidate.shape)} != eager {tuple(reference.shape)}")
            return
        ref, cand = reference.detach().double().cpu(), candidate.detach().double().cpu()
        diff = (cand - ref).abs()
        diff[ref.isnan() & cand.isnan()] = 0.0
        diff = torch.nan_to_num(diff, nan=math.inf)
        err = float(diff.max()) if diff.numel() else 0.0
        scale = float(torch.nan_to_num(ref.abs(), nan=0.0).max()) if ref.numel() else 0.0
        rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
        self.max_abs = err if self.max_abs is None else max(self.max_abs, err)
        self.max_rel = rel if self.max_rel is None else max(self.max_rel, rel)
        allowed = self.tol.atol + self.tol.rtol * scale
        if err > allowed:
            self.failures.append(
                f"{where}: max abs error {err:.3g} > {allowed:.3g} (atol {self.tol.atol:g} + rtol {self.tol.rtol:g}"
                f" x eager's max |value| {scale:.3g})"
            )

    def classifier(self, reference: torch.Tensor, candidate: torch.Tensor) -> None:
        self.top1[0] += int((reference.argmax(dim=1).cpu() == candidate.argmax(dim=1).cpu()).sum())
        self.top1[1] += reference.shape[0]

    def detections(self, reference: dict[str, torch.Tensor], candidate: dict[str, torch.Tensor]) -> None:
        from torchvision.ops import box_iou

        self.images += 1
        ref_boxes, cand_boxes = reference["boxes"].detach().float().cpu(), candidate["boxes"].detach().float().cpu()
        ref_scores, cand_scores = reference["scores"].detach().float().cpu(), candidate["scores"].detach().float().cpu()
        ious = box_iou(ref_boxes, cand_boxes) if len(ref_boxes) and len(cand_boxes) else torch.zeros(len(ref_boxes), 0)
        if "labels" in reference and "labels" in candidate and ious.numel():
            same = reference["labels"].cpu()[:, None] == candidate["labels"].cpu()[None, :]
            ious = torch.where(same, ious, torch.zeros_like(ious))
        floor = self.tol.score_floor
        ref_above, cand_above = ref_scores >= floor, cand_scores >= floor
        used = torch.zeros(len(cand_boxes), dtype=torch.bool)
        for i in torch.argsort(ref_scores, descending=True).tolist():
            if ious.shape[1] == 0:
                break
            row = ious[i].masked_fill(used, -1.0)
            j = int(row.argmax())
            if float(row[j]) < self.tol.iou_match:
                continue
            used[j] = True
            if not (ref_above[i] or cand_above[j]):
                continue
            self.matched[0] += int(ref_above[i]) + int(cand_above[j])
            iou, score = float(row[j]), abs(float(ref_scores[i] - cand_scores[j]))
            self.box_iou = iou if self.box_iou is None else min(self.box_iou, iou)
            self.score_diff = score if self.score_diff is None else max(self.score_diff, score)
        self.matched[1] += int(ref_above.sum()) + int(cand_above.sum())

    def report(self, variant: str, samples: int) -> ParityReport:
        tol, failures = self.tol, list(self.failures)
        top1 = self.top1[0] / self.top1[1] if self.top1[1] else None
        match = (self.matched[0] / self.matched[1] if self.matched[1] else 1.0) if self.images else None
        if top1 is not None and top1 < tol.min_top1:
            failures.append(f"top-1 agreement {top1:.3g} < {tol.min_top1:g}")
        if match is not None and match < tol.min_match:
            failures.append(f"detections matched {match:.3g} < {tol.min_match:g}")
        if self.box_iou is not None and self.box_iou < tol.min_box_iou:
            failures.append(f"worst matched box IoU {self.box_iou:.3g} < {tol.min_box_iou:g}")
        if self.score_diff is not None and self.score_diff > tol.max_score_diff:
            failures.append(f"largest score difference {self.score_diff:.3g} > {tol.max_score_diff:g}")
        return ParityReport(
            variant,
            tol,
            samples,
            self.max_abs,
            self.max_rel,
            top1,
            self.box_iou,
            self.score_diff,
            match,
            tuple(failures),
        )


def _is_detection(outputs: Any) -> bool:
    return isinstance(outputs, list) and all(isinstance(o, dict) and {"boxes", "scores"} <= o.keys() for o in outputs)


def compare(variant: str, references: Sequence[Any], candidates: Sequence[Any], tolerance: Tolerance) -> ParityReport:
    """Compare candidate outputs with eager's, sample by sample, into a report (never raises on a mismatch)."""
    figures = _Figures(tolerance)
    for n, (reference, candidate) in enumerate(zip(references, candidates, strict=True)):
        if _is_detection(reference):
            if not _is_detection(candidate) or len(candidate) != len(reference):
                figures.failures.append(f"sample {n}: detector output structure differs from eager")
                continue
            for ref_image, cand_image in zip(reference, candidate, strict=True):
                figures.detections(ref_image, cand_image)
            continue
        ref_tensors, cand_tensors = flat_tensors(reference), flat_tensors(candidate)
        if len(ref_tensors) != len(cand_tensors):
            figures.failures.append(f"sample {n}: {len(cand_tensors)} output tensors, eager gives {len(ref_tensors)}")
            continue
        for k, (ref, cand) in enumerate(zip(ref_tensors, cand_tensors, strict=True)):
            figures.tensors(f"sample {n} output {k}", ref, cand)
        if isinstance(reference, torch.Tensor) and reference.dim() == 2 and reference.shape[1] > 1:
            if reference.shape == cand_tensors[0].shape and reference.is_floating_point():
                figures.classifier(reference, cand_tensors[0])
    return figures.report(variant, len(references))


def check_parity(
    variant: str,
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    samples: Sequence[ModelInputs],
    tolerance: Tolerance,
) -> ParityReport:
    """Run both callables on every sample (no grad) and compare; the caller decides what a failure means."""
    with torch.no_grad():
        references = [reference(*sample) for sample in samples]
        candidates = [candidate(*sample) for sample in samples]
    return compare(variant, references, candidates, tolerance)
