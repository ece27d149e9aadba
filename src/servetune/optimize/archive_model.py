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
from typing import Any

import torch
from torch import nn

from servetune._exceptions import ArchiveError, ConfigError
from servetune.archive import ModelArchive, open_archive
from servetune.optimize._tree import ModelInputs

DEFAULT_INPUT_SHAPE = (3, 224, 224)


@dataclass
class ArchiveModel:
    """An archive's model on CPU, in eval mode, with what it takes as input."""

    archive: ModelArchive
    model: nn.Module
    input_shape: tuple[int, ...]
    image_list: bool
    """True when the model takes a list of images (torchvision detectors) instead of a batch tensor."""

    def make_inputs(self, batch: int, device: torch.device) -> ModelInputs:
        """Random inputs for one call of ``batch`` items, seeded so that every variant sees the same."""
        generator = torch.Generator().manual_seed(batch)
        images = torch.rand((batch, *self.input_shape), generator=generator).to(device)
        return (list(images),) if self.image_list else (images,)


def _input_shape(config: dict[str, Any]) -> tuple[int, ...]:
    shape = config.get("input_shape")
    if shape is None:
        return DEFAULT_INPUT_SHAPE
    if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ConfigError(
            f"model-config.yaml input_shape={shape!r}: expected a list of positive ints, e.g. [3, 224, 224]"
        )
    return tuple(shape)


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


def _is_detector(model: nn.Module) -> bool:
    return any(cls.__name__ == "GeneralizedRCNN" for cls in type(model).__mro__)


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
    else:
        raise ArchiveError(
            f"{source}: servetune optimize needs an eager model (modelFile + serializedFile) or TorchScript (.pt)"
        )
    return ArchiveModel(archive, model.eval(), _input_shape(archive.model_config), _is_detector(model))
