"""The parity comparison: tensor errors, classifier top-1, detector matching, and the tolerance object."""

from __future__ import annotations

import math

import pytest
import torch

from servetune import ConfigError
from servetune.optimize.parity import ParityReport, Tolerance, check_parity, compare


def test_identical_tensors_pass_with_zero_error() -> None:
    out = torch.randn(4, 10)
    report = compare("x", [out], [out.clone()], Tolerance())
    assert report.passed
    assert report.max_abs == 0.0 and report.max_rel == 0.0
    assert report.top1_agreement == 1.0


def test_error_is_measured_against_the_reference_scale() -> None:
    ref = torch.tensor([[10.0, 0.0, -5.0]])
    cand = ref + torch.tensor([[0.0, 0.01, 0.0]])  # off by 0.01 where the reference is 0
    report = compare("x", [ref], [cand], Tolerance(atol=0.0, rtol=2e-3))
    assert report.max_abs == pytest.approx(0.01)
    assert report.max_rel == pytest.approx(0.001)  # 0.01 / max|ref| = 0.01 / 10
    assert report.passed
    failing = compare("x", [ref], [cand], Tolerance(atol=0.0, rtol=5e-4))
    assert not failing.passed
    assert "max abs error 0.01 > 0.005" in failing.failures[0]


def test_top1_disagreement_fails_even_inside_the_tensor_tolerance() -> None:
    ref = torch.tensor([[1.0, 0.999], [0.0, 1.0]])
    cand = torch.tensor([[0.999, 1.0], [0.0, 1.0]])  # row 0's argmax flips
    report = compare("x", [ref], [cand], Tolerance(atol=0.01, rtol=0.0, min_top1=1.0))
    assert report.top1_agreement == 0.5
    assert report.failures == ("top-1 agreement 0.5 < 1",)
    assert compare("x", [ref], [cand], Tolerance(atol=0.01, min_top1=0.5)).passed


def test_nan_where_eager_has_none_is_an_infinite_error() -> None:
    ref = torch.zeros(2, 3)
    cand = ref.clone()
    cand[0, 0] = math.nan
    report = compare("x", [ref], [cand], Tolerance(atol=1.0, rtol=1.0))
    assert report.max_abs == math.inf
    assert not report.passed


def test_nested_outputs_are_compared_leaf_by_leaf() -> None:
    ref = {"logits": torch.ones(2, 3), "aux": (torch.zeros(2), torch.ones(2))}
    cand = {"logits": torch.ones(2, 3), "aux": (torch.zeros(2), torch.ones(2) * 1.5)}
    report = compare("x", [ref], [cand], Tolerance())
    assert report.max_abs == pytest.approx(0.5)
    assert "sample 0 output 2" in report.failures[0]


def test_structure_and_shape_mismatches_are_failures() -> None:
    assert not compare("x", [(torch.ones(2),)], [(torch.ones(2), torch.ones(2))], Tolerance()).passed
    report = compare("x", [torch.ones(2, 3)], [torch.ones(3, 2)], Tolerance())
    assert "shape (3, 2) != eager (2, 3)" in report.failures[0]


def _dets(boxes: list[list[float]], scores: list[float], labels: list[int]) -> dict[str, torch.Tensor]:
    return {"boxes": torch.tensor(boxes), "scores": torch.tensor(scores), "labels": torch.tensor(labels)}


def test_detections_match_by_iou_whatever_their_order() -> None:
    ref = [_dets([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.8], [1, 2])]
    cand = [_dets([[20, 20, 40, 40], [0, 0, 10, 10]], [0.8, 0.9], [2, 1])]
    report = compare("x", [ref], [cand], Tolerance())
    assert report.passed
    assert (report.match, report.box_iou, report.score_diff) == (1.0, 1.0, 0.0)
    assert report.max_abs is None and report.top1_agreement is None


def test_shifted_boxes_and_changed_scores_fail_with_figures() -> None:
    ref = [_dets([[0, 0, 10, 10]], [0.9], [1])]
    cand = [_dets([[1, 0, 11, 10]], [0.85], [1])]  # IoU 90/110
    report = compare("x", [ref], [cand], Tolerance(min_box_iou=0.9, max_score_diff=0.01))
    assert report.box_iou == pytest.approx(90 / 110)
    assert report.score_diff == pytest.approx(0.05)
    assert len(report.failures) == 2
    assert compare("x", [ref], [cand], Tolerance(min_box_iou=0.8, max_score_diff=0.06)).passed


def test_a_lost_or_relabelled_detection_lowers_the_match_fraction() -> None:
    ref = [_dets([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.8], [1, 2])]
    lost = [_dets([[0, 0, 10, 10]], [0.9], [1])]
    assert compare("x", [ref], [lost], Tolerance()).match == pytest.approx(2 / 3)
    relabelled = [_dets([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.8], [1, 3])]
    report = compare("x", [ref], [relabelled], Tolerance())
    assert report.match == pytest.approx(2 / 4)
    assert "detections matched 0.5 < 1" in report.failures


def test_detections_under_the_score_floor_on_both_sides_are_ignored() -> None:
    ref = [_dets([[0, 0, 10, 10], [50, 50, 60, 60]], [0.9, 0.1], [1, 1])]
    cand = [_dets([[0, 0, 10, 10]], [0.9], [1])]
    assert compare("x", [ref], [cand], Tolerance(score_floor=0.5)).passed
    assert not compare("x", [ref], [cand], Tolerance(score_floor=0.05)).passed


def test_check_parity_runs_both_callables() -> None:
    model = torch.nn.Linear(4, 3)
    report = check_parity("double", model, lambda x: model(x) * 2, [(torch.randn(5, 4),)], Tolerance())
    assert isinstance(report, ParityReport)
    assert not report.passed and report.samples == 1
    assert "max_abs=" in report.summary()


def test_tolerance_override_and_loosest() -> None:
    tol = Tolerance().override({"rtol": 0.1, "min_top1": 0.5})
    assert (tol.rtol, tol.min_top1, tol.atol) == (0.1, 0.5, Tolerance().atol)
    with pytest.raises(ConfigError, match="unknown tolerance 'rtl'"):
        Tolerance().override({"rtl": 0.1})
    with pytest.raises(ConfigError, match="expected a number >= 0"):
        Tolerance().override({"atol": -1.0})
    loose = Tolerance(atol=1e-2, min_top1=0.8).loosest(Tolerance(rtol=1e-1, min_box_iou=0.5))
    assert (loose.atol, loose.rtol, loose.min_top1, loose.min_box_iou) == (1e-2, 1e-1, 0.8, 0.5)
