"""The one registry of variants: name -> ``"module:attr"`` of a :class:`~servetune.optimize.base.Variant` class.

A variant spec is one name or several joined by ``+`` (``channels_last+bf16``). A chain holds at most one variant
of each kind (layout, precision, backend), runs in kind order whatever order it is written in, and a few pairs are
refused outright because they cannot make sense whatever the model.
"""

from __future__ import annotations

from servetune._exceptions import ConfigError
from servetune.optimize.base import KIND_ORDER, Variant
from servetune.registry import registered

VARIANTS: dict[str, str] = {
    "eager": "servetune.optimize.eager:Eager",
    "channels_last": "servetune.optimize.channels_last:ChannelsLast",
    "fp16": "servetune.optimize.fp16:Fp16",
    "bf16": "servetune.optimize.bf16:Bf16",
    "int8-dynamic": "servetune.optimize.int8_dynamic:Int8Dynamic",
    "torchscript": "servetune.optimize.torchscript:TorchScript",
    "compile": "servetune.optimize.compile:Compile",
    "onnx": "servetune.optimize.onnx:Onnx",
    "export": "servetune.optimize.export:Export",
    "aoti": "servetune.optimize.aoti:Aoti",
}

# Combinations tried by default (``servetune optimize`` without --variants), after the single variants.
DEFAULT_COMBINATIONS: tuple[str, ...] = ("channels_last+bf16", "channels_last+fp16", "channels_last+torchscript")

# Pairs that never make sense, with the reason given to whoever asks for them.
INCOMPATIBLE: dict[frozenset[str], str] = {
    frozenset({"channels_last", "onnx"}): "ONNX Runtime chooses its own memory layout; channels_last has no effect",
    frozenset({"int8-dynamic", "onnx"}): "dynamically quantized layers do not export to ONNX",
    frozenset({"bf16", "onnx"}): "ONNX Runtime is fed through numpy, which has no bfloat16",
    frozenset({"int8-dynamic", "export"}): "dynamically quantized layers hold packed parameters torch.export cannot "
    "trace",
    frozenset({"int8-dynamic", "aoti"}): "dynamically quantized layers hold packed parameters torch.export cannot "
    "trace",
}


def load_variant(name: str) -> Variant:
    """Instantiate the variant registered under ``name``."""
    unknown = f"unknown optimization variant {name!r}; expected one of {sorted(VARIANTS)}"
    cls: type[Variant] = registered(VARIANTS, name, unknown)
    return cls()


def resolve(spec: str) -> list[Variant]:
    """The variants of ``spec`` in the order they apply; a ConfigError says why a spec is malformed."""
    names = [part.strip() for part in spec.split("+")]
    if not spec.strip() or any(not name for name in names):
        raise ConfigError(f"optimization variant {spec!r}: expected NAME or NAME+NAME, e.g. 'channels_last+bf16'")
    if len(set(names)) != len(names):
        raise ConfigError(f"optimization variant {spec!r} names a variant twice")
    variants = [load_variant(name) for name in names]
    if len(variants) > 1:
        if any(v.kind == "baseline" for v in variants):
            raise ConfigError(f"optimization variant {spec!r}: 'eager' is the fp32 baseline and takes no partners")
        by_kind: dict[str, str] = {}
        for variant in variants:
            if variant.kind in by_kind:
                raise ConfigError(
                    f"optimization variant {spec!r}: {by_kind[variant.kind]!r} and {variant.name!r} are both "
                    f"{variant.kind} variants; a combination takes at most one of each kind"
                )
            by_kind[variant.kind] = variant.name
        for pair, reason in INCOMPATIBLE.items():
            if pair <= set(names):
                raise ConfigError(
                    f"optimization variant {spec!r}: {' and '.join(sorted(pair))} do not combine: {reason}"
                )
    return sorted(variants, key=lambda v: KIND_ORDER[v.kind])


def canonical_name(spec: str) -> str:
    """The spec written in application order (``bf16+channels_last`` -> ``channels_last+bf16``)."""
    return "+".join(variant.name for variant in resolve(spec))


def default_variants() -> list[str]:
    """Every single variant, then the default combinations."""
    return [*VARIANTS, *DEFAULT_COMBINATIONS]
