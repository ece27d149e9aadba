"""A model packed by TorchServe's own torch-model-archiver, with a TorchServe-style custom handler, served."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from http_client import burst, call

ARCHIVER = shutil.which("torch-model-archiver")

HANDLER = textwrap.dedent(
    '''
    import json
    import torch
    from ts.torch_handler.base_handler import BaseHandler
    from ts.utils.util import PredictionException


    class DoubleHandler(BaseHandler):
        """Reads JSON lists of 4 numbers; answers the model's output; 422 for a list of the wrong length."""

        def preprocess(self, data):
            rows = []
            for row in data:
                value = row.get("data") or row.get("body")
                if isinstance(value, (bytes, bytearray)):
                    value = json.loads(value)
                if len(value) != 4:
                    raise PredictionException("expected 4 numbers", 422)
                rows.append(value)
            return torch.tensor(rows, dtype=torch.float32)

        def postprocess(self, data):
            return data.tolist()
    '''
)

MODEL = textwrap.dedent(
    '''
    import torch

    class Linear4(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)
    '''
)


@pytest.mark.skipif(ARCHIVER is None, reason="torch-model-archiver is not installed (pip install torch-model-archiver)")
def test_torchserve_archive_and_handler_serve_unchanged(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    src.mkdir()
    (src / "handler.py").write_text(HANDLER)
    (src / "model.py").write_text(MODEL)
    torch.manual_seed(0)
    fc = torch.nn.Linear(4, 2)
    torch.save({"fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach()}, src / "weights.pt")
    (src / "model-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 200\n")
    store = tmp_path / "store"
    store.mkdir()
    assert ARCHIVER is not None
    subprocess.run(
        [ARCHIVER, "--model-name", "linear", "--version", "2.0", "--model-file", str(src / "model.py"),
         "--serialized-file", str(src / "weights.pt"), "--handler", str(src / "handler.py"),
         "--config-file", str(src / "model-config.yaml"), "--export-path", str(store)],
        check=True, capture_output=True, timeout=120,
    )
    server = start_server(model_store=store, models={"linear": "linear.mar"})
    rows = [[1, 2, 3, 4], [0, 0, 0, 0], [-1, 0.5, 2, 8], [3, 3, 3, 3]]
    replies = burst("POST", f"{server.inference_url}/predictions/linear", [json.dumps(r).encode() for r in rows],
                    {"Content-Type": "application/json"})
    assert all(r.status == 200 for r in replies), [r.body for r in replies]
    with torch.no_grad():
        expected = fc(torch.tensor(rows, dtype=torch.float32)).tolist()
    for reply, want in zip(replies, expected, strict=True):
        assert reply.json() == pytest.approx(want, abs=1e-5)
    assert max(int(r.headers["x-servetune-batch-size"]) for r in replies) > 1

    wrong = call("POST", f"{server.inference_url}/predictions/linear", b"[1, 2]", {"Content-Type": "application/json"})
    assert wrong.status == 422 and wrong.json()["message"] == "expected 4 numbers"
    info = call("GET", f"{server.management_url}/models/linear").json()[0]
    assert (info["modelVersion"], info["batchSize"], info["maxBatchDelay"]) == ("2.0", 4, 200)
