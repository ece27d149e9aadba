"""Triton through PyTriton: the tritonserver binary its wheel ships, a model of WORKERS instances (one Python
callable each) with Triton's dynamic batcher (max batch size, max queue delay)."""

from __future__ import annotations

import json

import numpy as np
from common import BATCH, DELAY_MS, MODEL, PORT, WORKERS, Model
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def instance() -> object:
    model = Model()

    @batch
    def infer(data: np.ndarray) -> dict[str, np.ndarray]:
        # a BYTES tensor from JSON arrives as the bytes of its text: here the base64 of the image (or "hello")
        bodies = [row[0].decode() if isinstance(row[0], bytes) else row[0] for row in data]
        answers = [json.dumps(a).encode() for a in model.predict(bodies)]
        return {"output": np.array(answers, dtype=object).reshape(-1, 1)}

    return infer


if __name__ == "__main__":
    config = TritonConfig(
        http_address="127.0.0.1", http_port=PORT, grpc_address="127.0.0.1", grpc_port=PORT + 1, metrics_port=PORT + 2
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=[instance() for _ in range(WORKERS)],
            inputs=[Tensor(name="data", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="output", dtype=bytes, shape=(1,))],
            config=ModelConfig(
                max_batch_size=max(BATCH, 1),
                batcher=DynamicBatcher(max_queue_delay_microseconds=int(DELAY_MS * 1000) if BATCH > 1 else 0),
            ),
            strict=False,
        )
        triton.serve()
