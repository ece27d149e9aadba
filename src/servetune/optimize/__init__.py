"""Model variants (fp16, bf16, channels_last, TorchScript, torch.compile, int8, ONNX Runtime, torch.export and
AOTInductor ``.pt2``) behind one registry, each checked against eager before use.

    variant = apply_variant("channels_last+bf16", model, device=torch.device("cpu"), example_inputs=(batch,))
    outputs = variant(batch)          # same call, float32 outputs
    variant.parity.summary()          # the figures of the check against eager

See docs/optimize.md.
"""

from __future__ import annotations

from servetune.optimize.apply import apply_variant, parity_samples, variant_tolerance
from servetune.optimize.base import Stage, Variant, VariantModel
from servetune.optimize.cache import default_cache_dir
from servetune.optimize.errors import OptimizeError, ParityError, VariantNotApplicable
from servetune.optimize.inputs import config_input_shape, sample_inputs
from servetune.optimize.parity import ParityReport, Tolerance, check_parity, compare
from servetune.optimize.pt2 import Pt2Model, load_pt2
from servetune.optimize.registry import VARIANTS, canonical_name, default_variants, resolve

__all__ = [
    "VARIANTS",
    "OptimizeError",
    "ParityError",
    "ParityReport",
    "Pt2Model",
    "Stage",
    "Tolerance",
    "Variant",
    "VariantModel",
    "VariantNotApplicable",
    "apply_variant",
    "canonical_name",
    "check_parity",
    "compare",
    "config_input_shape",
    "default_cache_dir",
    "default_variants",
    "load_pt2",
    "parity_samples",
    "resolve",
    "sample_inputs",
    "variant_tolerance",
]
