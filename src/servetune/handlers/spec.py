"""What a worker needs to load one model version, typed, and how it loads: the native worker process and the Ray
replica both call :func:`start_service` with a :class:`WorkerSpec`, so a model loads the same way on either backend.

CPU settings are applied before the handler is imported: ``cpu_cores`` (``os.sched_setaffinity``, as the Intel
launcher pins instances), then torch's intra-op and inter-op threads (inter-op threads can only be set once, before
any parallel work, so a change of them needs a new worker).

torch itself is not imported here: a handler that never uses it (a no-op, a text or numpy model) must not pay for
it (hundreds of MB and a second or more per worker). The thread settings are applied the moment torch is first
imported, by whichever module imports it, before that module can run any torch work (:func:`when_imported`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from servetune.handlers.service import Service, import_handler, load_service
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


# The threads this process wants torch to run with, applied at once if torch is loaded, else when it is imported.
_wanted = {"num_threads": 0, "inter_op_threads": 0}


def apply_cpu(num_threads: int, cpu_cores: tuple[int, ...]) -> None:
    """Intra-op threads and core set, changeable at any time (the frontend shares the cores anew after scaling)."""
    if cpu_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpu_cores)
    elif not cpu_cores and hasattr(os, "sched_setaffinity") and _PROCESS_CPUS:
        os.sched_setaffinity(0, _PROCESS_CPUS)  # unpinned again: every CPU this process started with
    if num_threads:
        _wanted["num_threads"] = num_threads
    torch = sys.modules.get("torch")
    if num_threads and torch is not None and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


def cpu_settings() -> CpuSettings:
    """What the process runs with: torch's own figures once torch is loaded, else the threads it will get when a
    handler imports it (0: torch's default)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        threads, inter_op = int(torch.get_num_threads()), int(torch.get_num_interop_threads())
    else:
        threads, inter_op = _wanted["num_threads"], _wanted["inter_op_threads"]
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    return CpuSettings(threads, inter_op, cores)


def _apply_threads(torch: Any) -> None:
    if _wanted["inter_op_threads"]:
        torch.set_num_interop_threads(_wanted["inter_op_threads"])
    if _wanted["num_threads"] and torch.get_num_threads() != _wanted["num_threads"]:
        torch.set_num_threads(_wanted["num_threads"])


class _ThenCall(importlib.abc.Loader):
    """A module's own loader, and a call once the module has run (then the module gets its own loader back)."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[Any], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._callback(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once, and never again for the lookup below
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenCall(spec.loader, self.callback)
                return spec
        return None


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` once the top-level module ``name`` has been imported: now if it already is, else
    right after its first import finishes executing, before the importer gets it back."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def prepare_cpu(spec: WorkerSpec) -> None:
    """This process's CPU settings from ``spec``: its cores and threads now, torch's threads now if torch is loaded
    (a worker forked from a parent that imported it), else the moment something imports it."""
    _wanted["inter_op_threads"] = spec.inter_op_threads
    apply_cpu(spec.num_threads, spec.cpu_cores)
    when_imported("torch", _apply_threads)


def preload(spec: WorkerSpec, level: str) -> Service | None:
    """What a model-loading parent process does before it forks workers: ``"imports"``: import the handler's module
    (and so torch, where it does); ``"model"``: load the whole model (``start_service``), which the forked workers then
    serve without loading it again. Runs with one thread: the parent must not start torch's thread pools (a forked
    child gets none of the threads, only their state); each worker sets its own threads after the fork."""
    parent = replace(spec, num_threads=1, inter_op_threads=0, cpu_cores=(), gpu_id=None)
    if level == "model":
        return start_service(parent)
    prepare_cpu(parent)
    import_handler(model_dir=Path(spec.model_dir), manifest=spec.manifest, model_name=spec.model_name)
    return None


def start_service(spec: WorkerSpec) -> Service:
    """Apply the CPU settings, then import and initialise the handler (raises as ``load_service`` does); torch's
    threads are set when something imports torch."""
    prepare_cpu(spec)
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

__all__ = [
    "CpuSettings",
    "WorkerSpec",
    "apply_cpu",
    "cpu_settings",
    "prepare_cpu",
    "preload",
    "start_service",
    "when_imported",
]
