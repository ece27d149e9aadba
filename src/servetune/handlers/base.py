"""``BaseHandler``: TorchServe's default handler contract (``ts.torch_handler.base_handler``).

``initialize`` picks the device, loads the model named by the manifest into ``self.model`` and the
optional ``index_to_name.json`` into ``self.mapping``; ``handle`` runs preprocess -> inference ->
postprocess. Bad inputs: ``preprocess_each`` calls ``preprocess_item`` per request and sets aside the
ones raising ``BadInputError``; the model runs on the rest and ``handle`` answers each rejected request
400 with its message (see docs/handlers.md).
"""

from __future__ import annotations

import abc
import importlib
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from servetune.handlers.codec import error_body
from servetune.handlers.context import Context
from servetune.handlers.metrics import timed
from servetune.handlers.util import (
    BadInputError,
    PredictionException,
    list_classes_from_module,
    load_label_mapping,
    request_input,
)

__all__ = ["BaseHandler"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BaseHandler(abc.ABC):  # noqa: B024 - abstract in name only, as TorchServe's (instantiable as "base_handler")
    """Loads eager (state_dict + model file), TorchScript, PyTorch 2 ``.pt2`` (an AOTInductor package or an
    ExportedProgram) or ONNX models and serves them."""

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: torch.device | None = None
        self.initialized = False
        self.context: Context | None = None
        self.model_pt_path: str | None = None
        self.manifest: dict[str, Any] | None = None
        self.map_location: str | None = None
        self.explain = False
        self.target = 0
        self.profiler_args: dict[str, Any] = {}
        self.model_yaml_config: dict[str, Any] = {}
        #: batch index -> message, for the requests of the current batch that preprocess rejected
        self.bad_inputs: dict[int, str] = {}

    # -- loading ---------------------------------------------------------------------------------------------

    def initialize(self, context: Context) -> None:
        """Load the model and label mapping; the device is ``cuda:<gpu_id>`` when given and available, else CPU."""
        self.context = context
        self.model_yaml_config = context.model_yaml_config or {}
        properties = context.system_properties
        gpu_id = properties.get("gpu_id")
        if gpu_id is not None and torch.cuda.is_available():
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{gpu_id}")
        elif gpu_id is not None and torch.backends.mps.is_available():
            self.map_location = "mps"
            self.device = torch.device("mps")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")
        # Thread counts are the worker's business (torch.set_num_threads before loading); never changed here.
        self.manifest = context.manifest
        model_dir = Path(properties["model_dir"])
        model_info = (self.manifest or {}).get("model") or {}
        serialized = model_info.get("serializedFile")
        self.model_pt_path = str(model_dir / serialized) if serialized else None
        self.model = self._load_model(model_dir, model_info.get("modelFile") or "", self.model_pt_path)
        self.mapping = load_label_mapping(model_dir / "index_to_name.json")
        self.initialized = True
        context.applies_optimization = True  # the loader refuses a named variant that no BaseHandler took
        self._apply_optimization()

    def _load_model(self, model_dir: Path, model_file: str, model_pt_path: str | None) -> Any:
        if model_file:
            model = self._load_pickled_model(str(model_dir), model_file, model_pt_path)
            return model.to(self.device).eval()
        if model_pt_path is None:
            raise RuntimeError("No model weights could be loaded: the manifest has no serializedFile and no modelFile")
        suffix = Path(model_pt_path).suffix
        if suffix == ".pt":
            return self._load_torchscript_model(model_pt_path).eval()
        if suffix == ".pt2":
            return self._load_pt2(model_pt_path)
        if suffix == ".onnx":
            from servetune.handlers.onnx import OnnxModel  # onnxruntime is an optional extra

            return OnnxModel(model_pt_path, self.device or torch.device("cpu"))
        raise RuntimeError(
            f"No model weights could be loaded from {Path(model_pt_path).name}: without a modelFile the "
            "serializedFile must be TorchScript (.pt), torch.export (.pt2) or ONNX (.onnx)"
        )

    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        with warnings.catch_warnings():
            # torch 2.9+ deprecates TorchScript, but .mar archives are full of it
            warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit")
            return torch.jit.load(model_pt_path, map_location=self.device)  # type: ignore[no-untyped-call]

    def _load_pt2(self, model_pt_path: str) -> Any:
        """An AOTInductor package or a saved ExportedProgram, checked against this worker's torch and device first
        (``servetune.optimize.pt2``); called like the model it was exported from."""
        from servetune.optimize.pt2 import load_pt2

        return load_pt2(model_pt_path, self.device or torch.device("cpu"))

    def _load_pickled_model(self, model_dir: str, model_file: str, model_pt_path: str | None) -> torch.nn.Module:
        """Instantiate the one ``nn.Module`` class of ``model_file`` and load its state_dict.

        ``torch.load(..., weights_only=True)`` unless model-config.yaml says ``weights_only: false``.
        """
        if not (Path(model_dir) / model_file).is_file():
            raise RuntimeError(f"Missing the model file {model_file!r} in {model_dir}")
        module = importlib.import_module(Path(model_file).name.split(".")[0])
        classes = list_classes_from_module(module, torch.nn.Module)
        if len(classes) != 1:
            names = ", ".join(c.__name__ for c in classes) or "none"
            raise ValueError(f"Expected only one nn.Module class as model definition in {model_file}; found: {names}")
        model: torch.nn.Module = classes[0]()
        if model_pt_path:
            weights_only = self.model_yaml_config.get("weights_only", True) is not False
            loaded, mapped = self._load_weights(model_pt_path, weights_only)
            if isinstance(loaded, torch.nn.Module):  # a whole pickled model (only with weights_only: false)
                return loaded
            model.load_state_dict(loaded, assign=mapped)
        return model

    def _load_weights(self, model_pt_path: str, weights_only: bool) -> tuple[Any, bool]:
        """``torch.load`` of the serialized file, and whether its tensors are memory-mapped.

        On the CPU the weights are memory-mapped from the archive's one
        extracted copy, and ``load_state_dict(assign=True)`` makes them the model's parameters: every worker of
        the model then reads the same page-cache pages instead of holding a private copy (copy-on-write, so a model
        that writes its weights still only changes its own). ``mmap_weights: false`` in model-config.yaml, or a
        file torch cannot map (the legacy, pre-zip format), loads a private copy as before."""
        mmap = self.map_location == "cpu" and self.model_yaml_config.get("mmap_weights", True) is not False
        if mmap:
            try:
                loaded = torch.load(model_pt_path, map_location="cpu", weights_only=weights_only, mmap=True)
            except RuntimeError as exc:
                logger.debug("weights of %s not memory-mapped (%s): loading a private copy", model_pt_path, exc)
            else:
                return loaded, True
        return torch.load(model_pt_path, map_location=self.device, weights_only=weights_only), False

    def _apply_optimization(self) -> None:
        """Apply ``model_yaml_config["optimization"]`` (a name from servetune.optimize) to ``self.model``.

        The variant is checked against eager on :meth:`example_inputs` before it serves; one that cannot apply
        or changes the answers fails the worker's load with the reason and the figures. ``parity_tolerance``
        (a mapping) overrides the variant's default tolerance.
        """
        name = self.model_yaml_config.get("optimization")
        self.optimization = "eager"
        if name and name != "eager" and _is_pt2(self.model):
            raise RuntimeError(
                f"optimization={name!r}: this archive's model is a .pt2, served as it was built; build the variant "
                "from the eager model instead (servetune optimize --variants aoti --write), or drop optimization"
            )
        if not name or name == "eager" or not isinstance(self.model, torch.nn.Module):
            if name and name != "eager":
                raise RuntimeError(f"optimization={name!r} needs an nn.Module, not {type(self.model).__name__}")
            return
        from servetune.optimize import apply_variant, default_cache_dir

        assert self.context is not None
        variant = apply_variant(
            str(name),
            self.model,
            device=self.device or torch.device("cpu"),
            example_inputs=self.example_inputs(),
            cache_dir=default_cache_dir(),
            tolerance=self.model_yaml_config.get("parity_tolerance"),
            max_batch=self.export_max_batch(),
        )
        self.model = variant
        self.optimization = str(name)
        if variant.parity is not None:
            logger.info("optimization %s applied: %s", name, variant.parity.summary())

    def export_max_batch(self) -> int:
        """The largest batch an exported variant (``export``, ``aoti``) must take: model-config.yaml's
        ``export_max_batch`` (the tuner sets its largest batch size), else the model's ``batchSize``."""
        assert self.context is not None
        configured = self.model_yaml_config.get("export_max_batch")
        if configured is not None:
            if isinstance(configured, bool) or not isinstance(configured, int) or configured < 1:
                raise ValueError(f"model-config.yaml export_max_batch={configured!r}: expected an integer >= 1")
            return configured
        return max(1, int(self.context.system_properties.get("batch_size") or 1))

    def loaded_model(self) -> dict[str, Any] | None:
        """What serves: for a ``.pt2`` its format, torch version, device and dynamic dimensions; for a variant its
        name, parity figures, conversion time and notes (with its ``.pt2``'s description for export/aoti); None for
        an eager model. The default ``describe_handle`` answers this."""
        from servetune.optimize import VariantModel

        model = self.model
        if _is_pt2(model):
            return {"pt2": {"file": model.path.name, **model.info.to_json()}}
        if not isinstance(model, VariantModel):
            return None
        described: dict[str, Any] = {
            "optimization": model.variant,
            "parity": model.parity.summary() if model.parity is not None else None,
            "convertSeconds": round(model.convert_seconds, 3),
            "notes": list(model.notes),
        }
        runner: Any = model.runner
        if _is_pt2(runner):
            described["pt2"] = {"file": runner.path.name, **runner.info.to_json()}
        return described

    def example_inputs(self) -> tuple[Any, ...]:
        """One model call's positional arguments, used to convert and check variants. Random images of
        ``input_shape`` (model-config.yaml, default 3x224x224) unless a handler knows better and overrides this."""
        from servetune.optimize import config_input_shape, sample_inputs

        assert isinstance(self.model, torch.nn.Module) and self.context is not None
        batch = max(1, min(int(self.context.system_properties.get("batch_size") or 1), 4))
        return tuple(sample_inputs(self.model, config_input_shape(self.model_yaml_config), batch, self.device))

    # -- serving ---------------------------------------------------------------------------------------------

    def preprocess_each(self, data: list[Any], preprocess_item: Callable[[Any], T]) -> list[T]:
        """``preprocess_item`` for every request; those raising ``BadInputError`` are set aside, the rest returned."""
        accepted: list[T] = []
        for idx, row in enumerate(data):
            try:
                accepted.append(preprocess_item(row))
            except BadInputError as exc:
                self.reject_input(idx, exc.message)
        return accepted

    def reject_input(self, idx: int, message: str) -> None:
        """Answer request ``idx`` of this batch 400 with ``message``; the model runs without it."""
        request_id = self.context.get_request_id(idx) if self.context is not None else None
        self.bad_inputs[idx] = f"request {request_id if request_id is not None else idx}: {message}"

    def preprocess_item(self, row: Any) -> torch.Tensor:
        """One request's input (``data`` or ``body``: a JSON array of numbers) as a tensor."""
        value = request_input(row)
        if value is None or isinstance(value, (bytes, bytearray, str, dict)):
            raise BadInputError(f"body must be a JSON array of numbers, got {_describe(value)}")
        try:
            return torch.as_tensor(value, device=self.device)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise BadInputError(f"body is not an array of numbers ({exc})") from exc

    @timed
    def preprocess(self, data: list[Any]) -> Any:
        """The batch as one tensor. Request dicts go through ``preprocess_each``; anything else ``torch.as_tensor``."""
        if data and all(isinstance(row, dict) for row in data):
            tensors = self.preprocess_each(data, self.preprocess_item)
            return torch.stack(tensors) if tensors else None
        return torch.as_tensor(data, device=self.device)

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            marshalled = data.to(self.device) if isinstance(data, torch.Tensor) else data
            return self.model(marshalled, *args, **kwargs)

    @timed
    def postprocess(self, data: Any) -> Any:
        return data.tolist()

    def handle(self, data: list[Any], context: Context) -> Any:
        """preprocess -> inference -> postprocess (or describe / explain), with per-request bad-input answers."""
        start = time.perf_counter()
        self.context = context
        self.bad_inputs = {}
        if self._is_describe():
            output: Any = [self.describe_handle()]
        else:
            data_preprocess = self.preprocess(data)
            if self.bad_inputs and len(self.bad_inputs) >= len(data):
                output = []
            elif self._is_explain():
                output = self.explain_handle(data_preprocess, data)
            else:
                output = self.postprocess(self.inference(data_preprocess))
            if self.bad_inputs:
                output = self._merge_rejected(output, len(data))
        context.metrics.add_time("HandlerTime", round((time.perf_counter() - start) * 1000.0, 2), None, "ms")
        return output

    def _merge_rejected(self, output: Any, batch_size: int) -> Any:
        if not isinstance(output, list) or len(output) != batch_size - len(self.bad_inputs):
            return output  # the worker reports the length mismatch
        results = iter(output)
        merged: list[Any] = []
        for idx in range(batch_size):
            message = self.bad_inputs.get(idx)
            if message is None:
                merged.append(next(results))
                continue
            assert self.context is not None
            self.context.set_response_status(400, "Bad Request", idx)
            self.context.set_response_content_type(idx, "application/json")
            merged.append(error_body(400, "BadRequestException", message))
        return merged

    def explain_handle(self, data_preprocess: Any, raw_data: list[Any]) -> Any:
        row = raw_data[0]
        inputs, target = None, 0
        if isinstance(row, dict):
            inputs = row.get("data") or row.get("body")
            target = row.get("target") or 0
        return self.get_insights(data_preprocess, inputs, target)

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any = 0) -> Any:
        raise PredictionException(f"{type(self).__name__} does not provide explanations", 501)

    def _is_explain(self) -> bool:
        if self.context is not None and self.context.get_request_header(0, "explain") == "True":
            self.explain = True
            return True
        return False

    def _is_describe(self) -> bool:
        return self.context is not None and self.context.get_request_header(0, "describe") == "True"

    def describe_handle(self) -> Any:
        """Customised model metadata for the describe API: what :meth:`loaded_model` says (None for an eager
        model, as TorchServe's handlers answer)."""
        return self.loaded_model()

    def get_device(self) -> torch.device | None:
        return self.device


def _is_pt2(model: Any) -> bool:
    from servetune.optimize.pt2 import Pt2Model

    return isinstance(model, Pt2Model)


def _describe(value: Any) -> str:
    if value is None:
        return "no 'data' or 'body' input"
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} raw bytes" if value else "an empty body"
    return f"a JSON {type(value).__name__}" if isinstance(value, dict) else f"a {type(value).__name__}"
