"""``servetune bench`` on Open Inference Protocol v2 REST (``--engine oip-json`` / ``oip-binary``) against a real
server: the same result as the built-in engine, requests built from .npy, OIP .json and raw files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kserve_models import build_store
from servetune._exceptions import BenchError
from servetune.bench import BenchSpec, run_bench
from servetune.bench.oip import oip_body, oip_request
from servetune.bench.payload import Payload
from servetune.tensors import parse_request


def test_requests_are_built_from_each_kind_of_input_file(tmp_path: Path) -> None:
    npy = tmp_path / "x.npy"
    np.save(npy, np.arange(6, dtype=np.float32).reshape(2, 3))
    request = oip_request(Payload("x.npy", npy.read_bytes(), None))
    assert (request.inputs[0].name, request.inputs[0].datatype, request.inputs[0].shape) == ("input-0", "FP32", (2, 3))
    given = {"id": "a", "inputs": [{"name": "t", "shape": [1], "datatype": "INT8", "data": [3]}]}
    assert oip_request(Payload("r.json", json.dumps(given).encode(), None)).inputs[0].data.tolist() == [3]
    raw = oip_request(Payload("cat.png", b"\x89PNG", None)).inputs[0]
    assert (raw.datatype, raw.shape, raw.data.tolist()) == ("BYTES", (1,), [b"\x89PNG"])
    body, headers = oip_body(Payload("x.npy", npy.read_bytes(), None), binary=True)
    header_length = int(dict(headers)["Inference-Header-Content-Length"])
    assert parse_request(body, header_length).parameters == {"binary_data_output": True}
    with pytest.raises(BenchError, match="not an inference request"):
        oip_request(Payload("bad.json", b'{"inputs": 3}', None))


@pytest.mark.parametrize("engine", ["oip-json", "oip-binary"])
def test_bench_drives_v2_rest(engine: str, start_server: Callable[..., Any], tmp_path: Path) -> None:
    store = tmp_path / "store"
    server = start_server(model_store=store, models=build_store(store, batch_ms=10.0))
    data = tmp_path / "x.npy"
    np.save(data, np.ones(4, dtype=np.float32))
    spec = BenchSpec(url=f"{server.inference_url}/v2/models/doubler/infer", input=data, engine=engine,
                     concurrency=4, requests=40, metrics_url=server.metrics_url)
    result = run_bench(spec)
    assert result.failed == 0 and result.sent == 40, result.errors
    assert result.server is not None and result.server.batch_size_mean is not None
    assert result.server.batch_size_mean > 1.0  # four clients on a batch-4 model
    assert result.labels.get("model", "doubler") == "doubler"
