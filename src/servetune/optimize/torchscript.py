"""``torchscript``: trace the model (falling back to scripting), then ``torch.jit.freeze`` and
``torch.jit.optimize_for_inference`` (conv-bn folding, oneDNN prepacking on CPU).

Tracing needs plain tensor inputs; torchvision detection models take a list and return dicts, so they are
scripted, and their scripted forward returns ``(losses, detections)``: the wrapper hands back the detections.
The cached artifact is the traced or scripted module before freezing (a frozen module does not reload reliably);
freezing runs again at every load.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn

from servetune.optimize.base import Stage, Variant
from servetune.optimize.cache import artifact_path
from servetune.optimize.inputs import is_detector


class _Detections(nn.Module):
    """Drops the losses a scripted torchvision detector returns beside its detections."""

    def __init__(self, scripted: nn.Module) -> None:
        super().__init__()
        self.scripted = scripted

    def forward(self, *inputs: Any) -> Any:
        outputs = self.scripted(*inputs)
        if isinstance(outputs, tuple) and len(outputs) == 2 and isinstance(outputs[0], dict):
            return outputs[1]
        return outputs


class TorchScript(Variant):
    name = "torchscript"
    kind = "backend"

    def check(self, stage: Stage) -> str | None:
        if stage.autocast_dtype is not None:
            return "TorchScript does not carry autocast, which reduced precision needs for models fed lists"
        return None

    def apply(self, stage: Stage) -> None:
        path = artifact_path(stage, ".pt")
        if path is not None and path.exists():
            scripted: torch.jit.ScriptModule = torch.jit.load(  # type: ignore[no-untyped-call]
                str(path), map_location=stage.device
            )
            stage.notes.append(f"loaded from cache {path.name}")
        else:
            scripted = self._script(stage)
            buffer = io.BytesIO()
            torch.jit.save(scripted, buffer)
            stage.artifact_bytes = buffer.getbuffer().nbytes
            if path is not None:
                path.write_bytes(buffer.getvalue())
        if path is not None:
            stage.artifact, stage.artifact_bytes = path, path.stat().st_size
        runner: nn.Module = self._freeze(scripted.eval(), stage)
        stage.runner = _Detections(runner) if is_detector(stage.source) else runner

    def _script(self, stage: Stage) -> torch.jit.ScriptModule:
        module = stage.module()
        if isinstance(module, torch.jit.ScriptModule):
            return module
        if stage.example_inputs is not None and not stage.structured:
            try:
                with torch.no_grad():
                    traced: torch.jit.ScriptModule = torch.jit.trace(  # type: ignore[no-untyped-call]
                        module, stage.adapt(stage.example_inputs), check_trace=False
                    )
                stage.notes.append("traced")
                return traced
            except Exception as exc:  # any tracing failure means: try scripting
                stage.notes.append(f"tracing failed ({type(exc).__name__}), scripted instead")
        scripted: torch.jit.ScriptModule = torch.jit.script(module)
        stage.notes.append("scripted")
        return scripted

    @staticmethod
    def _freeze(scripted: torch.jit.ScriptModule, stage: Stage) -> torch.jit.ScriptModule:
        try:
            frozen: torch.jit.ScriptModule = torch.jit.freeze(scripted)
        except Exception as exc:  # an unfreezable module still runs, unfrozen
            stage.notes.append(f"not frozen: {type(exc).__name__}")
            return scripted
        try:
            optimized: torch.jit.ScriptModule = torch.jit.optimize_for_inference(frozen)
        except Exception as exc:  # a frozen module is still a valid result
            stage.notes.append(f"optimize_for_inference failed: {type(exc).__name__}")
            return frozen
        return optimized
