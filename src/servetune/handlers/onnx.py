"""An ONNX Runtime session that ``BaseHandler`` can call like a torch model.

``OnnxModel(tensor, ...)`` feeds the tensors to the graph inputs in order and returns torch tensors, so the
default ``inference`` works; ``.run``, ``.get_inputs`` and the rest of ``onnxruntime.InferenceSession``
stay available for handlers written against TorchServe, where ``self.model`` is the session itself.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OnnxModel"]


class OnnxModel:
    def __init__(self, path: str, device: torch.device) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RuntimeError(f"{path}: ONNX models need onnxruntime (pip install 'servetune[onnx]')") from exc
        providers = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        options = ort.SessionOptions()
        # Follow the worker's torch thread setting instead of taking every core, as TorchServe does.
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        self.device = device

    def __call__(self, *inputs: Any) -> Any:
        names = [i.name for i in self.session.get_inputs()]
        if len(inputs) != len(names):
            raise ValueError(f"the ONNX model takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        feed = {name: _to_numpy(value) for name, value in zip(names, inputs, strict=True)}
        outputs = [torch.from_numpy(out) for out in self.session.run(None, feed)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __getattr__(self, name: str) -> Any:
        if name == "session":  # not yet set: avoid recursing while __init__ failed half-way
            raise AttributeError(name)
        return getattr(self.session, name)

    def eval(self) -> OnnxModel:
        return self

    def to(self, *args: Any, **kwargs: Any) -> OnnxModel:
        return self


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value
