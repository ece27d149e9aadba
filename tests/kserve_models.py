"""Archives for the KServe v1 / Open Inference Protocol tests, built with servetune's own archiver.

``doubler``: a handler written as TorchServe's KServe docs write them (a ``BaseHandler`` subclass whose rows are the
kservev2 envelope's input dicts, or the v1 instances): it doubles each row, sleeps ``batch_ms`` per batch and reports
the batch it ran in with ``context``; ``boom`` in a BYTES row fails it. ``tensors``: servetune's form (one
``InferenceRequest`` per request), with its metadata from the handler. Declared OIP metadata: ``doubler``'s
model-config.yaml.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from models import handler_archive

DOUBLER = textwrap.dedent(
    """
    import time

    import torch
    from ts.torch_handler.base_handler import BaseHandler
    from ts.utils.util import PredictionException


    class Doubler(BaseHandler):
        def initialize(self, context):
            self.context = context
            self.manifest = context.manifest
            self.batch_ms = float(context.model_yaml_config.get("batch_ms", 0))
            self.initialized = True

        def preprocess(self, data):
            rows = [row.get("data") if isinstance(row, dict) else row for row in data]
            for row in rows:
                if row == "boom":
                    raise ValueError("boom requested")
            try:
                return torch.stack([torch.as_tensor(row, dtype=torch.float64) for row in rows])
            except (TypeError, ValueError, RuntimeError) as exc:  # as a careful handler answers bad input
                raise PredictionException(f"rows must be equal-length lists of numbers ({exc})", 400)

        def inference(self, data, *args, **kwargs):
            time.sleep(self.batch_ms / 1000.0)
            return data * 2

        def postprocess(self, data):
            return data.tolist()
    """
)

TENSORS = textwrap.dedent(
    """
    import time

    import numpy as np

    servetune_envelope = "tensors"


    def model_metadata():
        return {
            "platform": "numpy_tensors",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}, {"name": "batch", "datatype": "INT64",
                                                                          "shape": [1]}],
        }


    def handle(data, context):
        if data is None:
            return None
        time.sleep(float(context.model_yaml_config.get("batch_ms", 0)) / 1000.0)
        answers = []
        for i, request in enumerate(data):
            x = request.input("x")
            answers.append({
                "y": x.data * 2,
                "batch": np.array([len(data)]),
                "echo": np.array([str(request.parameters.get("tag", "")), context.get_request_header(i, "explain")],
                                 dtype=object),
            })
        return answers
    """
)

DOUBLER_METADATA = {
    "platform": "pytorch_torchserve",
    "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, 2]}],
    "outputs": [{"name": "input-0", "datatype": "FP64", "shape": [-1]}],
}


def archive(store: Path, name: str, source: str, model_config: dict[str, Any]) -> Path:
    return handler_archive(store, name, f"{name}_handler.py", source, model_config)


def build_store(store: Path, batch_ms: float = 60.0) -> dict[str, str]:
    """The archives; returns the start-up models (name -> archive)."""
    batching = {"batchSize": 4, "maxBatchDelay": 200, "batch_ms": batch_ms}
    archive(store, "doubler", DOUBLER, {**batching, "oip": DOUBLER_METADATA})
    archive(store, "tensors", TENSORS, batching)
    return {"doubler": "doubler.mar", "tensors": "tensors.mar"}
