"""A model version's Open Inference Protocol metadata: its tensors, declared in its model-config.yaml or by its
handler, for every backend.

model-config.yaml (checked when the version is registered: a bad declaration is a 400 naming the key)::

    oip:
      platform: pytorch_torchscript        # informational, "<project>_<format>"; "" when not given
      inputs:  [{name: input-0, datatype: FP32, shape: [-1, 1, 28, 28]}]   # -1: any size
      outputs: [{name: output-0, datatype: INT64, shape: [-1]}]

Without ``inputs``/``outputs`` there, the handler is asked: its class (or module) may define ``model_metadata()``
returning the same mapping; the question goes to a worker as a request in a batch of its own (its typed control's
protocol ``oip-metadata``), so a version with no ready worker reports no tensors.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from servetune._exceptions import ApiError, ConfigError
from servetune.api.types import InferenceBackend, InferRequest, Input, ModelMetadata
from servetune.handlers.control import OIP_METADATA, Control
from servetune.tensors import TensorError, TensorMetadata

if TYPE_CHECKING:
    from servetune.api.plan import VersionPlan

METADATA_KEY = "oip"


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


def metadata_request() -> InferRequest:
    """The request that asks a worker for its handler's ``model_metadata()`` (a batch of its own)."""
    body = [Input("body", None, b"")]
    return InferRequest(str(uuid.uuid4()), {}, body, time.monotonic(), control=Control(OIP_METADATA))


async def model_metadata(backend: InferenceBackend, plan: VersionPlan, versions: list[str]) -> ModelMetadata:
    """The version's metadata: model-config.yaml's ``oip`` key, else its handler's, else no tensors."""
    declared = declared_metadata(plan.config.handler_config, source=plan.url)
    platform, inputs, outputs = declared or ("", (), ())
    if not inputs and not outputs:
        try:
            result = await backend.infer(plan.name, plan.version, metadata_request())
            answer = json.loads(result.body) if result.status == 200 else None
            if answer is not None:
                found = read_metadata(answer, f"model {plan.name}: model_metadata()", ValueError)
                platform, inputs, outputs = (platform or found[0]), found[1], found[2]
        except (ApiError, ValueError):
            pass  # no worker to ask, or nothing usable: no tensors
    return ModelMetadata(plan.name, tuple(sorted(versions)), platform, inputs, outputs)


__all__ = ["METADATA_KEY", "declared_metadata", "metadata_request", "model_metadata", "read_metadata"]
