"""``aoti``: AOTInductor. The model is exported with a dynamic batch (as ``export``), compiled ahead of time by
``torch._inductor.aoti_compile_and_package`` into one ``.pt2`` package (C++ and a shared library; on CUDA, Triton
kernels too), frozen (weights as constants: batch norms folded, oneDNN-prepacked convolutions on CPU), and loaded
with ``torch._inductor.aoti_load_package``: no Python in the model's call.

Compiling takes from seconds (a tiny model) to minutes (a ResNet on two cores); the package is cached per model,
torch version, device (with the CPU ISA or the GPU's compute capability) and batch bounds, so a second load of the
same model skips it, and workers of one model building the same package take turns. The package records the torch
and CUDA versions and its dynamic dimensions (metadata ``servetune.*``), which the loader checks (optimize/pt2.py).
Needs a C++ compiler, on CPU as on CUDA; on CUDA also Triton.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from servetune.archive.pt2 import META_CUDA, META_DYNAMIC, META_TORCH
from servetune.optimize._export import (
    batch_bound,
    build_or_load,
    check_exportable,
    dynamic_dims,
    dynamic_json,
    export_program,
)
from servetune.optimize.base import Stage, Variant
from servetune.optimize.compile import cxx_compiler
from servetune.optimize.parity import Tolerance


def target_tag(device: torch.device) -> str:
    """What a package is compiled for beyond the device type: the CPU's vector ISA, or the GPU's generation."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm{major}{minor}"
    from torch._inductor import cpu_vec_isa

    return str(cpu_vec_isa.pick_vec_isa()).replace(" ", "_") or "novec"


class Aoti(Variant):
    name = "aoti"
    kind = "backend"
    tolerance = Tolerance(atol=1e-4, rtol=1e-3)  # inductor's fused kernels reorder floating-point sums

    def check(self, stage: Stage) -> str | None:
        reason = check_exportable(stage)
        if reason is not None:
            return reason
        if cxx_compiler() is None:
            return "AOTInductor needs a C++ compiler (g++ or clang++) and none is on PATH"
        if stage.device.type == "cuda" and importlib.util.find_spec("triton") is None:
            return "AOTInductor on CUDA needs triton, which is not installed"
        if stage.device.type not in ("cpu", "cuda"):
            return f"AOTInductor packages are built for cpu or cuda, not {stage.device.type}"
        return None

    def apply(self, stage: Stage) -> None:
        bound = batch_bound(stage)

        def build(path: Path) -> None:
            program = export_program(stage, bound)
            metadata = {
                META_TORCH: torch.__version__,
                META_CUDA: (torch.version.cuda or "") if stage.device.type == "cuda" else "",
                META_DYNAMIC: dynamic_json(dynamic_dims(stage, bound)),
            }
            from torch._inductor import aoti_compile_and_package

            # freezing: weights become constants, so inductor folds batch norms into convolutions and, on CPU,
            # prepacks them for oneDNN (measured on resnet18, 1-2 threads: 0.97x TorchScript's p50 at batch 1
            # frozen, 1.2-1.3x not); it only applies without autograd
            with torch.no_grad():
                aoti_compile_and_package(
                    program,
                    package_path=str(path),
                    inductor_configs={"aot_inductor.metadata": metadata, "freezing": True},
                )
            stage.notes.append("compiled")

        build_or_load(stage, f"batch<={bound};{target_tag(stage.device)}", build)
        stage.notes.append(f"dynamic batch 1..{bound}")
