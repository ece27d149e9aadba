"""``onnx``: ``torch.onnx.export`` (the dynamo exporter, falling back to the TorchScript one), then an ONNX Runtime
``InferenceSession``: the CUDA execution provider on a CUDA device, the CPU provider otherwise.

The batch dimension of every input is exported dynamic; other dimensions are fixed at the example's. Models fed
lists (torchvision detectors) are not exported. Needs the ``onnx`` extra: ``pip install 'servetune[onnx]'``.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from servetune.optimize._tree import ModelInputs, flat_tensors, map_tensors, rebatch
from servetune.optimize.base import Stage, Variant
from servetune.optimize.cache import artifact_path


class OnnxRunner:
    """Calls an ONNX Runtime session like a torch module: tensors in, the eager output's structure out."""

    def __init__(self, session: Any, template: Any, device: torch.device) -> None:
        self.session = session
        self.names = [node.name for node in session.get_inputs()]
        self.template = template
        self.device = device

    def __call__(self, *inputs: Any) -> Any:
        tensors = flat_tensors(inputs)
        feeds = {name: tensor.detach().cpu().numpy() for name, tensor in zip(self.names, tensors, strict=True)}
        results: Iterator[Any] = iter(self.session.run(None, feeds))
        return map_tensors(self.template, lambda _: torch.from_numpy(next(results)).to(self.device))


def _providers(device: torch.device) -> list[Any]:
    import onnxruntime

    if device.type != "cuda":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise RuntimeError("onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)")
    return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]


def _export(module: nn.Module, args: ModelInputs, path: Path, stage: Stage) -> None:
    batch = torch.export.Dim("batch", min=1, max=65536)
    try:
        program = torch.onnx.export(
            module, args, dynamo=True, verbose=False, dynamic_shapes=tuple({0: batch} for _ in args)
        )
        assert program is not None
        program.save(str(path))
        stage.notes.append("dynamo exporter")
        return
    except Exception as exc:  # the TorchScript exporter takes some models the dynamo one refuses
        first_error = exc
    names = [f"input_{n}" for n in range(len(args))]
    try:
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=names,
            dynamic_axes={name: {0: "batch"} for name in names},
        )
    except Exception as exc:
        raise RuntimeError(f"dynamo exporter: {first_error}; TorchScript exporter: {exc}") from exc
    stage.notes.append(f"TorchScript exporter (dynamo: {type(first_error).__name__})")


class Onnx(Variant):
    name = "onnx"
    kind = "backend"

    def check(self, stage: Stage) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
            return "onnx and onnxruntime are not installed (pip install 'servetune[onnx]')"
        if stage.example_inputs is None:
            return "ONNX export needs example inputs"
        if stage.structured:
            return "ONNX export takes plain tensor inputs; this model takes lists or dicts (a detection model)"
        return None

    def apply(self, stage: Stage) -> None:
        import onnxruntime

        assert stage.example_inputs is not None
        providers = _providers(stage.device)
        with torch.no_grad():
            template = map_tensors(stage.source(*stage.example_inputs), lambda _: torch.empty(0))
        with tempfile.TemporaryDirectory(prefix="servetune-onnx-") as scratch:
            path = artifact_path(stage, ".onnx")
            if path is not None and path.exists():
                stage.notes.append(f"loaded from cache {path.name}")
            else:
                target = path or Path(scratch) / "model.onnx"
                # Export at batch >= 2: torch.export specializes a dimension of size 1.
                args = stage.adapt(
                    rebatch(stage.example_inputs, max(2, flat_tensors(stage.example_inputs)[0].shape[0]))
                )
                _export(stage.module(), args, target, stage)
                path = target
            stage.artifact_bytes = path.stat().st_size
            stage.artifact = path if stage.cache_dir is not None else None
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 3  # errors only: ORT's warnings about unused initializers are noise
            options.intra_op_num_threads = torch.get_num_threads()  # the worker's thread budget, as for torch
            session = onnxruntime.InferenceSession(str(path), sess_options=options, providers=providers)
        stage.runner = OnnxRunner(session, template, stage.device)
