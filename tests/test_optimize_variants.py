"""apply_variant on small real models, on CPU: every variant converts, passes parity against eager, and is called
like the original; variants that cannot apply say why; a variant that changes the answers is rejected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from servetune.optimize import (
    VARIANTS,
    ParityError,
    Stage,
    Variant,
    VariantModel,
    VariantNotApplicable,
    apply_variant,
    parity_samples,
)

CPU = torch.device("cpu")


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class ConvOnly(nn.Module):
    """Image in, image out: a 4-D output, and no Linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def small_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def cnn_inputs(batch: int = 2) -> tuple[torch.Tensor]:
    return (torch.rand(batch, 3, 16, 16),)


def mlp_inputs(batch: int = 4) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 16),)


CPU_VARIANTS = ["eager", "channels_last", "bf16", "int8-dynamic", "torchscript", "onnx", "channels_last+bf16"]


@pytest.mark.parametrize("name", CPU_VARIANTS)
def test_each_variant_matches_eager_on_a_small_cnn(name: str) -> None:
    model = SmallCNN()
    variant = apply_variant(name, model, device=CPU, example_inputs=cnn_inputs())
    report = variant.parity
    assert report is not None and report.passed
    assert report.samples == 2  # the example, and the example at another batch size
    assert report.max_abs is not None and report.max_rel is not None
    assert report.max_abs <= report.tolerance.atol + report.tolerance.rtol * 10  # logits are O(1)
    assert report.top1_agreement is not None and report.top1_agreement >= report.tolerance.min_top1
    fresh = cnn_inputs(5)
    out = variant(*fresh)
    assert out.dtype == torch.float32 and out.shape == (5, 10)
    with torch.no_grad():
        assert torch.allclose(out, model(*fresh), atol=0.1)


@pytest.mark.parametrize("name", ["eager", "bf16", "int8-dynamic", "torchscript", "onnx"])
def test_each_applicable_variant_matches_eager_on_a_small_mlp(name: str) -> None:
    variant = apply_variant(name, small_mlp(), device=CPU, example_inputs=mlp_inputs())
    assert variant.parity is not None and variant.parity.passed
    assert variant(*mlp_inputs(1)).shape == (1, 5)


def test_reduced_precision_is_exact_for_eager_and_not_for_bf16() -> None:
    model = SmallCNN()
    eager = apply_variant("eager", model, device=CPU, example_inputs=cnn_inputs())
    bf16 = apply_variant("bf16", model, device=CPU, example_inputs=cnn_inputs())
    assert eager.parity is not None and eager.parity.max_abs == 0.0
    assert bf16.parity is not None and bf16.parity.max_abs is not None and bf16.parity.max_abs > 0.0
    assert next(model.parameters()).dtype == torch.float32  # the caller's model is left as it was


def test_int8_dynamic_quantizes_the_linear_layers() -> None:
    variant = apply_variant("int8-dynamic", small_mlp(), device=CPU, example_inputs=mlp_inputs())
    kinds = [m._get_name() for m in variant.modules()]
    assert kinds.count("DynamicQuantizedLinear") == 2
    assert not any(type(m) is nn.Linear for m in variant.modules())


def test_channels_last_outputs_come_back_contiguous() -> None:
    variant = apply_variant("channels_last", ConvOnly(), device=CPU, example_inputs=cnn_inputs())
    out = variant(*cnn_inputs())
    assert out.shape == (2, 4, 16, 16) and out.is_contiguous()
    assert variant.parity is not None and variant.parity.top1_agreement is None  # not a classifier output


@pytest.mark.parametrize(
    ("name", "model", "inputs", "reason"),
    [
        ("fp16", SmallCNN, cnn_inputs, "fp16 needs a CUDA device (got cpu)"),
        ("channels_last", small_mlp, mlp_inputs, "the model has no 2-D convolution"),
        ("channels_last+bf16", small_mlp, mlp_inputs, "the model has no 2-D convolution"),
        ("int8-dynamic", ConvOnly, cnn_inputs, "the model has no Linear or LSTM layer to quantize"),
    ],
)
def test_variants_that_cannot_apply_say_why(name: str, model: type, inputs: type, reason: str) -> None:
    with pytest.raises(VariantNotApplicable) as caught:
        apply_variant(name, model(), device=CPU, example_inputs=inputs())
    assert caught.value.variant == name
    assert caught.value.reason.startswith(reason)


def test_without_example_inputs_only_unchecked_variants_apply() -> None:
    model = SmallCNN()
    eager = apply_variant("eager", model, device=CPU, example_inputs=None)
    assert eager.parity is None
    with pytest.raises(VariantNotApplicable, match="example inputs are needed to check parity"):
        apply_variant("bf16", model, device=CPU, example_inputs=None)
    unchecked = apply_variant("bf16", model, device=CPU, example_inputs=None, check=False)
    assert unchecked(*cnn_inputs()).dtype == torch.float32
    with pytest.raises(VariantNotApplicable, match="ONNX export needs example inputs"):
        apply_variant("onnx", model, device=CPU, example_inputs=None, check=False)


class Perturbed(Variant):
    """A deliberately broken variant: eager plus 0.5 everywhere."""

    name = "perturbed"
    kind = "backend"

    def apply(self, stage: Stage) -> None:
        module = stage.module()
        stage.runner = lambda *inputs: module(*inputs) + 0.5


def test_a_variant_that_changes_the_answers_is_rejected_with_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(VARIANTS, "perturbed", f"{__name__}:Perturbed")
    with pytest.raises(ParityError) as caught:
        apply_variant("perturbed", SmallCNN(), device=CPU, example_inputs=cnn_inputs())
    report = caught.value.report
    assert not report.passed
    assert report.max_abs == pytest.approx(0.5, abs=1e-5)
    assert report.failures and "max abs error 0.5" in report.failures[0]
    assert "max_abs=0.5" in str(caught.value)


def test_tolerances_can_be_tightened_until_bf16_fails() -> None:
    with pytest.raises(ParityError) as caught:
        apply_variant("bf16", SmallCNN(), device=CPU, example_inputs=cnn_inputs(), tolerance={"atol": 0, "rtol": 1e-7})
    assert caught.value.report.tolerance.rtol == 1e-7
    assert caught.value.report.tolerance.min_top1 == 0.8  # the other fields keep bf16's defaults


@pytest.mark.parametrize(("name", "suffix"), [("torchscript", ".pt"), ("onnx", ".onnx")])
def test_converted_artifacts_are_cached_and_reused(tmp_path: Path, name: str, suffix: str) -> None:
    model = SmallCNN()
    first = apply_variant(name, model, device=CPU, example_inputs=cnn_inputs(), cache_dir=tmp_path)
    assert first.artifact is not None and first.artifact.suffix == suffix and first.artifact.parent == tmp_path
    assert first.artifact_bytes == first.artifact.stat().st_size > 0
    second = apply_variant(name, model, device=CPU, example_inputs=cnn_inputs(), cache_dir=tmp_path)
    assert second.artifact == first.artifact
    assert any(note.startswith("loaded from cache") for note in second.notes)
    assert second.parity is not None and second.parity.passed
    with torch.no_grad():
        model.head.bias.add_(1.0)  # new weights, new key: converted afresh
    third = apply_variant(name, model, device=CPU, example_inputs=cnn_inputs(), cache_dir=tmp_path)
    assert third.artifact != first.artifact
    assert len(list(tmp_path.iterdir())) == 2


def test_a_variant_model_is_a_module_called_like_the_original() -> None:
    variant = apply_variant("torchscript", SmallCNN(), device=CPU, example_inputs=cnn_inputs())
    assert isinstance(variant, VariantModel) and isinstance(variant, nn.Module)
    assert variant.variant == "torchscript" and variant.convert_seconds > 0
    assert "traced" in variant.notes
    with torch.inference_mode():  # as a handler calls it
        assert variant(*cnn_inputs(3)).shape == (3, 10)


def test_parity_samples_vary_the_batch_size() -> None:
    (x,) = cnn_inputs(2)
    samples = parity_samples((x,))
    assert [s[0].shape[0] for s in samples] == [2, 4]
    assert torch.equal(samples[1][0][2:], x)
    assert len(parity_samples(([x[0], x[1]],))) == 1  # lists of images are used as given


def tiny_detector() -> nn.Module:
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1), nn.ReLU())
    backbone.out_channels = 8
    model = FasterRCNN(
        backbone,
        num_classes=3,
        rpn_anchor_generator=AnchorGenerator(sizes=((16, 32),), aspect_ratios=((0.5, 1.0, 2.0),)),
        box_roi_pool=MultiScaleRoIAlign(featmap_names=["0"], output_size=7, sampling_ratio=2),
        min_size=64,
        max_size=64,
        representation_size=64,
    )
    with torch.no_grad():
        model.roi_heads.box_predictor.cls_score.weight.mul_(20)  # spread the scores of random weights
    return model.eval()


def detector_inputs() -> tuple[list[torch.Tensor]]:
    return ([torch.rand(3, 64, 64), torch.rand(3, 64, 80)],)


DETECTOR_TOLERANCE = {"score_floor": 0.3}


def test_a_detector_is_scripted_and_returns_detections() -> None:
    variant = apply_variant(
        "torchscript", tiny_detector(), device=CPU, example_inputs=detector_inputs(), tolerance=DETECTOR_TOLERANCE
    )
    assert "scripted" in variant.notes
    report = variant.parity
    assert report is not None and report.passed
    assert report.match == 1.0 and report.box_iou == pytest.approx(1.0) and report.max_abs is None
    out = variant(*detector_inputs())
    assert isinstance(out, list) and len(out) == 2 and {"boxes", "labels", "scores"} <= out[0].keys()


def test_a_detector_in_bf16_runs_under_autocast_and_returns_float32() -> None:
    loose = {**DETECTOR_TOLERANCE, "min_box_iou": 0.0, "min_match": 0.0, "max_score_diff": 1.0}
    variant = apply_variant("bf16", tiny_detector(), device=CPU, example_inputs=detector_inputs(), tolerance=loose)
    assert variant.autocast_dtype == torch.bfloat16 and variant.input_dtype is None
    assert variant.parity is not None and variant.parity.box_iou is not None and variant.parity.match is not None
    out = variant(*detector_inputs())
    assert out[0]["boxes"].dtype == torch.float32 and out[0]["scores"].dtype == torch.float32


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("onnx", "ONNX export takes plain tensor inputs"),
        ("bf16+torchscript", "TorchScript does not carry autocast"),
    ],
)
def test_detector_variants_that_cannot_apply_say_why(name: str, reason: str) -> None:
    with pytest.raises(VariantNotApplicable, match=reason):
        apply_variant(name, tiny_detector(), device=CPU, example_inputs=detector_inputs())


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["fp16", "bf16", "channels_last+fp16", "torchscript", "eager"])
def test_cuda_variants_match_eager(name: str) -> None:
    cuda = torch.device("cuda")
    model = SmallCNN().to(cuda)
    (x,) = cnn_inputs()
    variant = apply_variant(name, model, device=cuda, example_inputs=(x.to(cuda),))
    assert variant.parity is not None and variant.parity.passed
    out = variant(x.to(cuda))
    assert out.dtype == torch.float32 and out.device.type == "cuda"


@pytest.mark.gpu
@requires_cuda
def test_onnx_uses_the_cuda_provider() -> None:
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime here has no CUDAExecutionProvider (onnxruntime-gpu)")
    cuda = torch.device("cuda")
    (x,) = cnn_inputs()
    variant = apply_variant("onnx", SmallCNN().to(cuda), device=cuda, example_inputs=(x.to(cuda),))
    assert variant.runner.session.get_providers()[0] == "CUDAExecutionProvider"
    assert variant.parity is not None and variant.parity.passed
    assert variant(x.to(cuda)).device.type == "cuda"


@pytest.mark.gpu
@requires_cuda
def test_int8_dynamic_does_not_apply_on_cuda() -> None:
    cuda = torch.device("cuda")
    with pytest.raises(VariantNotApplicable, match="dynamic int8 kernels run on CPU only"):
        apply_variant("int8-dynamic", small_mlp().to(cuda), device=cuda, example_inputs=(mlp_inputs()[0].to(cuda),))
