"""``export``: ``torch.export.export`` with a dynamic batch, saved as a ``.pt2`` (``torch.export.save``) and run in
Python (the ExportedProgram's module: the same aten operations as eager, no Python control flow, no compiler).

PyTorch's replacement for TorchScript as a deployable graph: what ``--write`` makes of it is an archive any
servetune handler loads by extension, and ``aoti`` compiles the same program ahead of time. The cached artifact is
keyed by the model, torch, the device and the batch bounds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from servetune.optimize._export import batch_bound, build_or_load, check_exportable, export_program
from servetune.optimize.base import Stage, Variant


class Export(Variant):
    name = "export"
    kind = "backend"

    def check(self, stage: Stage) -> str | None:
        return check_exportable(stage)

    def apply(self, stage: Stage) -> None:
        bound = batch_bound(stage)

        def build(path: Path) -> None:
            torch.export.save(export_program(stage, bound), str(path))

        build_or_load(stage, f"batch<={bound}", build)
        stage.notes.append(f"dynamic batch 1..{bound}")
