"""Load an archive's model in-process for ``servetune optimize``, and make sample inputs for it.

An eager archive (``modelFile`` + ``serializedFile``): the model file's one ``nn.Module`` class, instantiated
without arguments, with the state_dict loaded ``weights_only=True``. Without a model file the serialized file
must be TorchScript (``.pt``, ``torch.jit.load``). Sample inputs are random images, ``3x224x224`` unless the
archive's model-config.yaml gives ``input_shape`` (without the batch dimension); torchvision detection models
get a list of images rather than a batch tensor.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from servetune._exceptions import ArchiveError
from servetune.archive import ModelArchive, open_archive
from servetune.optimize._tree import ModelInputs
from servetune.optimize.inputs import config_input_shape, sample_inputs


@dataclass
class ArchiveModel:
    """An archive's model on CPU, in eval mode, with what it takes as input."""

    archive: ModelArchive
    model: nn.Module
    input_shape: tuple[int, ...]

    def make_inputs(self, batch: int, device: torch.device) -> ModelInputs:
        """Random inputs for one call of ``batch`` items, seeded so that every variant sees the same."""
        return sample_inputs(self.model, self.input_shape, batch, device)


def _model_class(model_dir: Path, model_file: str) -> type[nn.Module]:
    path = model_dir / model_file
    if not path.is_file():
        raise ArchiveError(f"the manifest names modelFile {model_file!r} but the archive has no such file")
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ArchiveError(f"cannot import the model file {model_file!r}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(model_dir))  # the model file may import its siblings, as in a worker
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(model_dir))
    classes = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == name and issubclass(cls, nn.Module)
    ]
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise ArchiveError(f"expected one nn.Module class in {model_file}; found: {found}")
    return classes[0]


def load_archive_model(source: Path, workdir: Path) -> ArchiveModel:
    """Open ``source`` (extracting into ``workdir``) and load its model on CPU."""
    archive = open_archive(source, workdir)
    info = archive.manifest.model
    serialized = archive.model_dir / info.serialized_file if info.serialized_file else None
    if info.model_file:
        model = _model_class(archive.model_dir, info.model_file)()
        if serialized is not None:
            model.load_state_dict(torch.load(serialized, map_location="cpu", weights_only=True))
    elif serialized is not None and serialized.suffix == ".pt":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit")
            model = torch.jit.load(str(serialized), map_location="cpu")  # type: ignore[no-untyped-call]
    elif serialized is not None and serialized.suffix == ".pt2":
        raise ArchiveError(
            f"{source}: its model is a .pt2, already exported or compiled (served as it is); servetune optimize "
            "takes the eager (modelFile + serializedFile) or TorchScript (.pt) archive it came from"
        )
    else:
        raise ArchiveError(
            f"{source}: servetune optimize needs an eager model (modelFile + serializedFile) or TorchScript (.pt)"
        )
    return ArchiveModel(archive, model.eval(), config_input_shape(archive.model_config))
