"""TorchServe's request-envelope and OIP keys in config.properties and the environment, and their way to the worker."""

from __future__ import annotations

import pytest

from servetune._exceptions import ConfigError
from servetune.config.server import ServerConfig


def test_service_envelope_is_read_from_the_file_or_ts_service_envelope() -> None:
    assert ServerConfig.from_properties({}).service_envelope is None
    assert ServerConfig.from_properties({"service_envelope": "kservev2"}).service_envelope == "kservev2"
    environ = {"TS_SERVICE_ENVELOPE": "kserve"}
    assert ServerConfig.load(environ=environ).service_envelope is None  # env only with enable_envvars_config
    enabled = {**environ, "TS_ENABLE_ENVVARS_CONFIG": "true"}
    assert ServerConfig.load(environ=enabled).service_envelope == "kserve"
    assert ServerConfig.load(environ={**enabled, "TS_SERVICE_ENVELOPE": ""}).service_envelope is None
    with pytest.raises(ConfigError, match="service_envelope='soap'"):
        ServerConfig.from_properties({"service_envelope": "soap"})


def test_ts_open_inference_protocol_is_read_as_torchserve_reads_it() -> None:
    assert ServerConfig.from_properties({"ts_open_inference_protocol": "true"}).ts_open_inference_protocol
    assert ServerConfig.load(environ={"TS_OPEN_INFERENCE_PROTOCOL": "oip"}).ts_open_inference_protocol
    assert not ServerConfig.load(environ={"TS_OPEN_INFERENCE_PROTOCOL": "grpc"}).ts_open_inference_protocol


def test_the_envelope_reaches_the_worker_spec(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kserve_models import build_store
    from servetune.api.plan import RegisterParams, plan_version
    from servetune.archive import open_archive

    build_store(tmp_path)
    archive = open_archive(tmp_path / "doubler.mar", tmp_path / "x")
    config = ServerConfig.from_properties({"service_envelope": "kservev2"})
    plan = plan_version(config, archive, tmp_path / "doubler.mar", RegisterParams(url="doubler.mar"), 1)
    assert plan.worker_spec(archive.model_dir, gpu_id=None, num_threads=1).service_envelope == "kservev2"


def test_a_bad_oip_declaration_in_model_config_is_refused_at_registration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kserve_models import DOUBLER, archive
    from servetune._exceptions import ApiError
    from servetune.api.plan import RegisterParams, plan_version
    from servetune.archive import open_archive

    archive(tmp_path, "bad", DOUBLER, {"oip": {"inputs": [{"name": "x", "datatype": "FP99", "shape": [1]}]}})
    opened = open_archive(tmp_path / "bad.mar", tmp_path / "x")
    with pytest.raises(ApiError, match="FP99"):
        plan_version(ServerConfig(), opened, tmp_path / "bad.mar", RegisterParams(url="bad.mar"), 1)
