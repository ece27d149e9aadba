"""What a worker needs to load one model version, typed, and how it loads: the native worker process and the Ray
replica both call :func:`start_service` with a :class:`WorkerSpec`, so a model loads the same way on either backend.

CPU settings are applied before the handler is imported: ``cpu_cores`` (``os.sched_setaffinity``, as the Intel
launcher pins instances), then torch's intra-op and inter-op threads (inter-op threads can only be set once, before
any parallel work, so a change of them needs a new worker).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servetune.handlers.service import Service, load_service
from servetune.tensor_limits import TensorLimits


@dataclass(frozen=True)
class WorkerSpec:
    model_name: str
    model_dir: str
    manifest: dict[str, Any]
    batch_size: int
    model_yaml_config: dict[str, Any] = field(default_factory=dict)
    gpu_id: int | None = None
    num_threads: int = 0  # 0: torch's default
    inter_op_threads: int = 0  # 0: torch's default
    cpu_cores: tuple[int, ...] = ()  # (): not pinned
    limit_max_image_pixels: bool = True
    decode_input_request: bool = True
    service_envelope: str | None = None  # TorchServe's service_envelope, for requests on its own routes
    tensor_limits: tuple[int, int, int] | None = None  # the server's max_tensor_* keys (None: the defaults)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> WorkerSpec:
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        known["cpu_cores"] = tuple(known.get("cpu_cores") or ())
        if known.get("tensor_limits") is not None:
            known["tensor_limits"] = tuple(known["tensor_limits"])
        return cls(**known)


@dataclass(frozen=True)
class CpuSettings:
    """What a worker process runs with, as it reports it (describe reads these back)."""

    num_threads: int
    inter_op_threads: int
    cpu_cores: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"num_threads": self.num_threads, "inter_op_threads": self.inter_op_threads, "cpu_cores": self.cpu_cores}


def apply_cpu(num_threads: int, cpu_cores: tuple[int, ...]) -> None:
    """Intra-op threads and core set, changeable at any time (the frontend shares the cores anew after scaling)."""
    if cpu_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpu_cores)
    elif not cpu_cores and hasattr(os, "sched_setaffinity") and _PROCESS_CPUS:
        os.sched_setaffinity(0, _PROCESS_CPUS)  # unpinned again: every CPU this process started with
    torch = sys.modules.get("torch")
    if num_threads and torch is not None and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


def cpu_settings() -> CpuSettings:
    torch = sys.modules.get("torch")
    threads = int(torch.get_num_threads()) if torch is not None else 0
    inter_op = int(torch.get_num_interop_threads()) if torch is not None else 0
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    return CpuSettings(threads, inter_op, cores)


def start_service(spec: WorkerSpec) -> Service:
    """Apply the CPU settings, then import and initialise the handler (raises as ``load_service`` does)."""
    import torch

    if spec.inter_op_threads:
        torch.set_num_interop_threads(spec.inter_op_threads)
    apply_cpu(spec.num_threads, spec.cpu_cores)
    return load_service(
        model_dir=Path(spec.model_dir),
        manifest=spec.manifest,
        model_name=spec.model_name,
        gpu_id=spec.gpu_id,
        batch_size=spec.batch_size,
        model_yaml_config=spec.model_yaml_config,
        limit_max_image_pixels=spec.limit_max_image_pixels,
        decode_input_request=spec.decode_input_request,
        service_envelope=spec.service_envelope,
        tensor_limits=TensorLimits(*spec.tensor_limits) if spec.tensor_limits else None,
    )


_PROCESS_CPUS: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()

__all__ = ["CpuSettings", "WorkerSpec", "apply_cpu", "cpu_settings", "start_service"]
