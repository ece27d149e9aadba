"""``compile``: ``torch.compile`` with the inductor backend.

Compilation is lazy: it happens on the first call with each new input shape (the conversion time of this variant
counts the first call). On CPU inductor generates C++ and needs a C++ compiler. Inductor keeps its own on-disk
cache (``TORCHINDUCTOR_CACHE_DIR``), so servetune writes no artifact for this variant.
"""

from __future__ import annotations

import os
import shutil

import torch

from servetune.optimize.base import Stage, Variant
from servetune.optimize.parity import Tolerance


def cxx_compiler() -> str | None:
    for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


class Compile(Variant):
    name = "compile"
    kind = "backend"
    tolerance = Tolerance(atol=1e-4, rtol=1e-3)

    def check(self, stage: Stage) -> str | None:
        if isinstance(stage.source, torch.jit.ScriptModule):
            return "torch.compile does not take a TorchScript module"
        if stage.device.type == "cpu" and cxx_compiler() is None:
            return "inductor on CPU needs a C++ compiler (g++ or clang++) and none is on PATH"
        return None

    def apply(self, stage: Stage) -> None:
        stage.runner = torch.compile(stage.module(), backend="inductor")
