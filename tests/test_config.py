"""config.properties parsing, model-config merging and the precedence rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servetune._exceptions import ConfigError
from servetune.config import Address, ModelConfig, ServerConfig, parse_properties


def test_properties_syntax() -> None:
    text = (
        "# comment\n! also comment\n"
        "inference_address=http://0.0.0.0:8080\n"
        "management_address : http://127.0.0.1:9\n"
        "job_queue_size 7\n"
        "long=a\\\n    b\n"
        "escaped\\ key=x\\ty\n"
    )
    props = parse_properties(text)
    assert props == {
        "inference_address": "http://0.0.0.0:8080",
        "management_address": "http://127.0.0.1:9",
        "job_queue_size": "7",
        "long": "ab",
        "escaped key": "x\ty",
    }


def test_env_substitution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORE_DIR", "/models")
    assert parse_properties("model_store=$$STORE_DIR$$/x") == {"model_store": "/models/x"}
    with pytest.raises(ConfigError, match="NOT_SET_ANYWHERE"):
        parse_properties("model_store=$$NOT_SET_ANYWHERE$$")


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=30)))
def test_properties_round_trip(values: dict[str, str]) -> None:
    def escape(v: str) -> str:
        return v.replace("\\", "\\\\").replace("$$", "$\\$")

    text = "".join(f"{k}={escape(v)}\n" for k, v in values.items())
    assert parse_properties(text) == {k: v.strip() for k, v in values.items()}


def test_server_defaults_are_safe() -> None:
    config = ServerConfig()
    for address in (config.inference_address, config.management_address, config.metrics_address):
        assert address.host == "127.0.0.1"
    assert (config.inference_address.port, config.management_address.port, config.metrics_address.port) == (
        8080, 8081, 8082)
    assert config.token_auth and not config.enable_model_api and config.allowed_urls == ()
    assert config.job_queue_size == 100 and config.max_request_size == 6553500
    assert (config.max_header_line_size, config.max_header_size, config.max_header_count) == (8192, 65536, 100)
    assert config.header_timeout_ms == 20000
    assert config.body_timeout_ms == 60000
    assert config.incoming_bytes == 1 << 30  # bodies arriving at once, per port: 1 GiB, or 4 of max_request_size
    assert ServerConfig.from_properties({"max_request_size": str(1 << 30)}).incoming_bytes == 4 << 30
    with pytest.raises(ConfigError, match="max_incoming_bytes=1000 is less than max_request_size=6553500"):
        ServerConfig.from_properties({"max_incoming_bytes": "1000"})
    limits = ServerConfig.from_properties({"max_tensor_elements": "10", "max_tensor_dims": "3"}).tensor_limits
    assert (limits.max_elements, limits.max_dims, limits.max_empty_span) == (10, 3, 65536)


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "config.properties"
    cfg.write_text("job_queue_size=10\nmax_request_size=11\ndefault_response_timeout=12\nenable_envvars_config=true\n")
    env = {"TS_MAX_REQUEST_SIZE": "21", "TS_DEFAULT_RESPONSE_TIMEOUT": "22"}
    config = ServerConfig.load(cfg, cli={"default_response_timeout": "33"}, environ=env)
    assert (config.job_queue_size, config.max_request_size, config.default_response_timeout) == (10, 21, 33)
    # Without enable_envvars_config the environment is not read (TorchServe's rule).
    cfg.write_text("max_request_size=11\n")
    assert ServerConfig.load(cfg, environ=env).max_request_size == 11


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("job_queue_size", "lots", "job_queue_size='lots': expected an integer"),
        ("job_queue_size", "0", "must be >= 1"),
        ("inference_address", "localhost:80", "expected http://HOST:PORT"),
        ("enable_model_api", "maybe", "expected true or false"),
        ("models", "{not json", "not valid JSON"),
        ("allowed_urls", "http://(", "not a valid regular expression"),
        ("worker_preload", "always", "worker_preload='always': expected one of auto, model, imports, off"),
        ("max_header_size", "10", "must be >= 64"),
        ("header_timeout_ms", "0", "must be >= 1"),
        ("body_timeout_ms", "0", "must be >= 1"),
        ("max_tensor_dims", "65", "must be <= 64"),
    ],
)
def test_invalid_values_name_key_and_value(key: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ServerConfig.from_properties({key: value})


def test_address_port_zero_and_ipv6() -> None:
    assert Address.parse("k", "http://127.0.0.1:0").port == 0
    assert Address.parse("k", "http://[::1]:8080").url() == "http://[::1]:8080"


def test_model_config_yaml_keys_and_handler_passthrough() -> None:
    yaml_config = {"batchSize": 8, "maxBatchDelay": 50, "minWorkers": 2, "maxWorkers": 4, "deviceType": "cpu",
                   "handler": {"threshold": 0.5}}
    config = ModelConfig().merged(yaml_config, source="model-config.yaml")
    assert (config.batch_size, config.max_batch_delay_ms, config.min_workers, config.max_workers) == (8, 50, 2, 4)
    assert config.device_type == "cpu"
    assert config.handler_config["handler"] == {"threshold": 0.5}
    api = config.with_api_params(batch_size=2, max_batch_delay_ms=None)
    assert (api.batch_size, api.max_batch_delay_ms) == (2, 50)


@pytest.mark.parametrize(
    "bad", [{"batchSize": 0}, {"batchSize": "8"}, {"deviceType": "tpu"}, {"deviceIds": [-1]},
            {"minWorkers": 3, "maxWorkers": 1}, {"workerPreload": True}, {"workerPreload": "fork"}],
)
def test_model_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="model-config.yaml"):
        ModelConfig().merged(bad, source="model-config.yaml")


def test_worker_preload_model_config_over_the_server_default() -> None:
    assert ServerConfig().worker_preload == "auto"
    assert ServerConfig.from_properties({"worker_preload": "imports"}).worker_preload == "imports"
    assert ModelConfig().merged({"workerPreload": "off"}, source="model-config.yaml").worker_preload == "off"
    assert ModelConfig().worker_preload is None  # the server's default applies
