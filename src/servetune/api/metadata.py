"""A model version's Open Inference Protocol metadata: its tensors, declared in its model-config.yaml or by its
handler, for every backend.

model-config.yaml (checked when the version is registered: a bad declaration is a 400 naming the key)::

    oip:
      platform: pytorch_torchscript        # informational, "<project>_<format>"; "" when not given
      inputs:  [{name: input-0, datatype: FP32, shape: [-1, 1, 28, 28]}]   # -1: any size
      outputs: [{name: output-0, datatype: INT64, shape: [-1]}]

Without ``inputs``/``outputs`` there, the handler's: its class (or module) may define ``model_metadata()`` returning
the same mapping; a worker (native) or replica (Ray) reports it once, when it has loaded the model, and the backend
answers from that report, so a version with no worker loaded yet reports no tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from servetune._exceptions import ConfigError
from servetune.api.types import ModelMetadata
from servetune.tensors import TensorError, TensorMetadata

if TYPE_CHECKING:
    from servetune.api.plan import VersionPlan

METADATA_KEY = "oip"
log = logging.getLogger("servetune.api")


def declared_metadata(
    config: Mapping[str, Any], *, source: str
) -> tuple[str, tuple[TensorMetadata, ...], tuple[TensorMetadata, ...]] | None:
    """``(platform, inputs, outputs)`` from a model-config.yaml's ``oip`` key (None when absent); ConfigError names
    the key."""
    raw = config.get(METADATA_KEY)
    if raw is None:
        return None
    return read_metadata(raw, f"{source}: {METADATA_KEY}", ConfigError)


def read_metadata(
    raw: Any, where: str, error: type[Exception] = ConfigError
) -> tuple[str, tuple[TensorMetadata, ...], tuple[TensorMetadata, ...]]:
    if not isinstance(raw, Mapping):
        raise error(f"{where}: expected a mapping with platform, inputs, outputs; got {raw!r}")
    unknown = sorted(set(raw) - {"platform", "inputs", "outputs"})
    if unknown:
        raise error(f"{where}: unknown keys {unknown}: expected platform, inputs, outputs")
    platform = raw.get("platform", "")
    if not isinstance(platform, str):
        raise error(f"{where}.platform={platform!r}: expected a string")
    tensors: dict[str, tuple[TensorMetadata, ...]] = {}
    for key in ("inputs", "outputs"):
        items = raw.get(key) or []
        if not isinstance(items, list):
            raise error(f"{where}.{key}: expected a list of {{name, datatype, shape}}")
        try:
            tensors[key] = tuple(TensorMetadata.from_json(item, f"{where}.{key}[{i}]") for i, item in enumerate(items))
        except TensorError as exc:
            raise error(str(exc)) from None
    return platform, tensors["inputs"], tensors["outputs"]


def model_metadata(plan: VersionPlan, versions: list[str], handler: Any = None) -> ModelMetadata:
    """The version's metadata: model-config.yaml's ``oip`` key, else ``handler`` (what its handler's
    ``model_metadata()`` answered, as a worker reported it; None: nothing), else no tensors."""
    declared = declared_metadata(plan.config.handler_config, source=plan.url)
    platform, inputs, outputs = declared or ("", (), ())
    if not inputs and not outputs and handler is not None:
        try:
            found = read_metadata(handler, f"model {plan.name}: model_metadata()", ValueError)
        except ValueError as exc:  # the handler's own declaration is unusable: no tensors, and the reason logged
            log.warning("%s", exc)
        else:
            platform, inputs, outputs = (platform or found[0]), found[1], found[2]
    return ModelMetadata(plan.name, tuple(sorted(versions)), platform, inputs, outputs)


__all__ = ["METADATA_KEY", "declared_metadata", "model_metadata", "read_metadata"]
