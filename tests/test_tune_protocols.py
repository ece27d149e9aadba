"""``servetune tune --protocol``: a model tuned as its real callers will call it (KServe v1, OIP v2 over JSON, binary
or gRPC, TorchServe's gRPC), on a real server, with the KServe test model (``kserve_models.doubler``, a handler
written as TorchServe's KServe docs write them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from kserve_models import DOUBLER, DOUBLER_METADATA, archive
from servetune._exceptions import ConfigError
from servetune.tune import load_study, override, tune
from tune_studies import refused, study_files

pytestmark = pytest.mark.slow  # about 30 s: a real server per protocol

# protocol -> (input file, the URL path the trials must have used, the engine)
INPUTS = {
    "v2-binary": ("x.npy", "/v2/models/doubler/infer", "oip-binary"),
    "v2-json": ("x.npy", "/v2/models/doubler/infer", "oip-json"),
    "kserve-v1": ("x.json", "/v1/models/doubler:predict", "async"),
    "v2-grpc": ("request.json", "/v2/models/doubler/infer", "grpc"),  # gRPC sends an OIP JSON request typed
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("protocols")
    mar = archive(folder / "store", "doubler", DOUBLER, {"batch_ms": 5, "oip": DOUBLER_METADATA})
    np.save(folder / "x.npy", np.array([[1.0, 2.0]], dtype=np.float32))
    (folder / "x.json").write_text(json.dumps({"instances": [[1.0, 2.0]]}))
    tensor = {"name": "input-0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
    (folder / "request.json").write_text(json.dumps({"inputs": [tensor]}))
    return mar


@pytest.mark.parametrize("protocol", list(INPUTS))
def test_the_trials_call_the_model_over_the_protocol(model: Path, tmp_path: Path, protocol: str) -> None:
    name, path, engine = INPUTS[protocol]
    study = {
        "model": "doubler",
        "archive": str(model),
        "input": str(model.parent.parent / name),
        "sla": {"p99_ms": 2000},
        "space": {"workers": [1], "batch_size": [1, 4], "batch_delay_ms": [5]},
        "load": {"duration": "0.5s", "warmup": "0.2s"},
        "strategy": {"name": "grid", "remeasure": 0, "finalists": 0},
        "contention": {"retries": 0},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    result = tune(override(load_study(tmp_path / "study.yaml"), protocol=protocol), tmp_path / "out")
    assert [t.status for t in result.trials] == ["ok", "ok"], [t.error for t in result.trials]
    for trial in result.trials:
        assert trial.result is not None and trial.result.failed == 0 and trial.result.engine == engine
        assert trial.result.url.endswith(path)
        # the server's own timing came back with every answer: the requests arrived over that protocol
        server = trial.result.server
        assert server is not None and server.source == "headers" and server.requests == trial.result.succeeded
    assert result.study.families[0].load.protocol == protocol
    fresh = load_study(tmp_path / "study.yaml")
    assert override(fresh, protocol=protocol).fingerprint() != fresh.fingerprint()  # another protocol, other costs


def test_the_command_line_takes_the_protocol(model: Path, tmp_path: Path) -> None:
    study = {"model": "doubler", "archive": str(model), "input": str(model.parent.parent / "x.npy"),
             "space": {"workers": [1]}, "load": {"duration": "0.3s", "warmup": "0.1s"},
             "strategy": {"name": "grid", "remeasure": 0, "finalists": 0}, "contention": {"retries": 0}}  # fmt: skip
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    done = subprocess.run(
        [sys.executable, "-m", "servetune", "tune", str(tmp_path / "study.yaml"), "--protocol", "v2-binary",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trial = json.loads((tmp_path / "out" / "trials.jsonl").read_text().splitlines()[1])
    assert trial["result"]["engine"] == "oip-binary"


def test_invalid_protocols_are_refused_naming_the_key(tmp_path: Path) -> None:
    study_files(tmp_path)
    base = {"archive": "model.mar", "input": "input.png", "space": {"workers": [1]}}
    refused(tmp_path, {**base, "load": {"protocol": "soap"}}, r"^load\.protocol='soap': expected one of torchserve")
    refused(tmp_path, {**base, "load": {"engine": "ab", "protocol": "v2-json"}},
            r"^load\.protocol='v2-json': Apache Bench \(load.engine ab\) speaks TorchServe's API only")  # fmt: skip
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError, match=r"^--protocol='grpc': expected one of torchserve"):
        override(load_study(tmp_path / "ok.yaml", devices={"cpu"}), protocol="grpc")
