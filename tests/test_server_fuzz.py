"""Schemathesis against the served OpenAPI documents: no 5xx other than the documented ones, no crash."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from http_client import call
from models import sleep_archive

pytestmark = pytest.mark.skipif(shutil.which("schemathesis") is None, reason="schemathesis is not installed")


@pytest.mark.parametrize("api", ["inference", "management"])
def test_openapi_fuzz(api: str, tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "store"
    sleep_archive(store, batch_ms=0)
    server = start_server(model_store=store, models={"sleep": "sleep.mar"},
                          properties={"enable_model_api": "true", "disable_token_authorization": "false"})
    base = getattr(server, f"{api}_url")
    spec = call("OPTIONS", f"{base}/").json()
    spec_file = tmp_path / f"{api}.json"
    spec_file.write_text(json.dumps(spec))
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run", str(spec_file), "--url", base,
        "--checks", "not_a_server_error,status_code_conformance,response_schema_conformance",
        "--max-examples", "25", "--seed", "1", "--workers", "1", "--phases", "examples,coverage,fuzzing",
        "--header", f"Authorization: Bearer {server.token}",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # The server is still up and serving after the fuzzing.
    assert call("GET", f"{server.inference_url}/ping").status == 200
