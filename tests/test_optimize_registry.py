"""The variant registry: names, combinations, and the combinations refused with a reason."""

from __future__ import annotations

import pytest

from servetune import ConfigError
from servetune.optimize import VARIANTS, canonical_name, default_variants, resolve
from servetune.optimize.base import Variant


def test_every_registered_variant_loads_under_its_own_name() -> None:
    for name in VARIANTS:
        (variant,) = resolve(name)
        assert isinstance(variant, Variant)
        assert variant.name == name


def test_combinations_apply_in_kind_order_whatever_the_spelling() -> None:
    assert [v.name for v in resolve("torchscript+bf16+channels_last")] == ["channels_last", "bf16", "torchscript"]
    assert canonical_name("bf16 + channels_last") == "channels_last+bf16"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("turbo", "unknown optimization variant 'turbo'"),
        ("", "expected NAME or NAME+NAME"),
        ("bf16+", "expected NAME or NAME+NAME"),
        ("bf16+bf16", "names a variant twice"),
        ("eager+bf16", "'eager' is the fp32 baseline and takes no partners"),
        ("fp16+bf16", "both precision variants"),
        ("torchscript+onnx", "both backend variants"),
        ("int8-dynamic+onnx", "dynamically quantized layers do not export to ONNX"),
        ("channels_last+onnx", "ONNX Runtime chooses its own memory layout"),
        ("bf16+onnx", "numpy, which has no bfloat16"),
    ],
)
def test_bad_specs_say_why(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("+", r"\+").replace("(", r"\(")):
        resolve(spec)


def test_default_variants_all_resolve() -> None:
    names = default_variants()
    assert names[0] == "eager"
    assert set(VARIANTS) <= set(names)
    assert "channels_last+bf16" in names
    for name in names:
        assert canonical_name(name) == name
