"""Server settings: TorchServe's ``config.properties`` keys, typed and validated once.

Precedence, one rule for every key (see docs/configuration.md):
    CLI flags > environment (``TS_<KEY>``, read only when ``enable_envvars_config=true``) > config file > defaults.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError
from servetune.config.model import WORKER_PRELOAD
from servetune.config.properties import read_properties
from servetune.tensor_limits import TensorLimits

log = logging.getLogger("servetune.config")

SERVICE_ENVELOPES = ("body", "json", "kserve", "kservev2")  # TorchServe's request envelopes

_ADDRESS = re.compile(r"^(https?)://(\[[^\]]+\]|[^:/]+)(?::(\d+))?/?$", re.IGNORECASE)

# Keys TorchServe reads that servetune accepts but does not act on: logged once at start, never silently dropped.
_ACCEPTED_NOT_USED = frozenset(
    {
        "number_of_netty_threads",
        "netty_client_threads",
        "vmargs",
        "async_logging",
        "prefer_direct_buffer",
        "use_native_io",
        "io_ratio",
        "initial_worker_port",
        "initial_distribution_port",
        "metrics_mode",
        "metrics_config",
        "metric_time_interval",
        "model_metrics_auto_detect",
        "disable_system_metrics",
        "system_metrics_cmd",
        "install_py_dep_per_model",
        "workflow_store",
        "ipex_enable",
        "ipex_gpu_enable",
        "model_server_home",
        "debug",
        "unregister_model_timeout",
        "use_env_allowed_urls",
        "default_service_handler",
        "blacklist_env_vars",
    }
)


@dataclass(frozen=True)
class Address:
    """A bound HTTP address; port 0 asks the OS for a free port."""

    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, key: str, value: str) -> Address:
        match = _ADDRESS.match(value.strip())
        if match is None:
            raise ConfigError(f"{key}={value!r}: expected http://HOST:PORT")
        scheme, host, port = match.group(1).lower(), match.group(2).strip("[]"), match.group(3)
        if scheme == "https":
            raise ConfigError(f"{key}={value!r}: https is not supported yet; terminate TLS in a proxy")
        port_num = int(port) if port else 80
        if not 0 <= port_num <= 65535:
            raise ConfigError(f"{key}={value!r}: port must be 0..65535")
        return cls(scheme, host, port_num)

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port if port is None else port}"


def _bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"{key}={value!r}: expected true or false")


def _host(key: str, value: str) -> str:
    """A gRPC bind address as TorchServe takes it: a host or IP (``0.0.0.0``, ``::``), brackets optional."""
    host = value.strip().strip("[]")
    if not host or any(c in host for c in "/ "):
        raise ConfigError(f"{key}={value!r}: expected a host or IP address, e.g. 127.0.0.1 or 0.0.0.0")
    return host


def _int(key: str, value: str, minimum: int = 0) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ConfigError(f"{key}={value!r}: expected an integer") from None
    if number < minimum:
        raise ConfigError(f"{key}={value!r}: must be >= {minimum}")
    return number


@dataclass(frozen=True)
class ServerConfig:
    """Every server-wide setting. Build with :meth:`load`; construct directly in code and tests."""

    inference_address: Address = Address("http", "127.0.0.1", 8080)
    management_address: Address = Address("http", "127.0.0.1", 8081)
    metrics_address: Address = Address("http", "127.0.0.1", 8082)
    model_store: Path | None = None
    load_models: tuple[str, ...] = ()
    models: Mapping[str, Any] = field(default_factory=dict)
    # TorchServe's snapshot (``model_snapshot={"name": ..., "models": {name: {version: {"marName": ..., ...}}}}``): the
    # start-up models and their settings, as TorchServe's KServe images ship them; it wins over ``load_models``
    model_snapshot: Mapping[str, Any] = field(default_factory=dict)
    default_workers_per_model: int = 0
    number_of_gpu: int | None = None
    job_queue_size: int = 100
    max_request_size: int = 6553500
    max_response_size: int = 6553500
    default_response_timeout: int = 120
    default_startup_timeout: int = 120
    enable_model_api: bool = False
    enable_metrics_api: bool = True
    disable_token_authorization: bool = False
    inference_token_authorization: bool = False
    open_ping: bool = False
    token_expiration_min: int = 60
    key_file: Path = Path("key_file.json")
    allowed_urls: tuple[str, ...] = ()
    threads_per_worker: int = 0
    max_workers_per_model: int = 64
    limit_max_image_pixels: bool = True
    decode_input_request: bool = True
    cors_allowed_origin: str = ""
    shutdown_grace_period: float = 30.0
    cpu_launcher_enable: bool = False  # TorchServe's key: every model's workers pinned to cores of their own
    cpu_launcher_args: str = ""  # TorchServe's launcher flags; servetune maps --ncores_per_instance, see below
    worker_preload: str = "auto"  # how workers start, unless model-config.yaml says (``workerPreload``): WORKER_PRELOAD
    # TorchServe's gRPC APIs (and the Open Inference Protocol's, on the inference port): a host, not a URL
    grpc_inference_address: str = "127.0.0.1"
    grpc_management_address: str = "127.0.0.1"
    grpc_inference_port: int = 7070  # 0: any free port
    grpc_management_port: int = 7071
    grpc_inference_max_connection_age_ms: int = 0  # 0: connections live as long as the client keeps them
    grpc_management_max_connection_age_ms: int = 0
    grpc_inference_max_connection_age_grace_ms: int = 0
    grpc_management_max_connection_age_grace_ms: int = 0
    service_envelope: str | None = None  # body|json|kserve|kservev2: requests on TorchServe's routes (docs/kserve.md)
    # Limits on what one request may be, checked before work is done (docs/limits.md)
    max_header_line_size: int = 8192  # the request line or one header line, bytes: 414/431
    max_header_size: int = 65536  # the request line and every header, bytes: 431
    max_header_count: int = 100  # headers in one request: 431
    header_timeout_ms: int = 20000  # from a connection's start (or a request's first byte) to its last header: 408
    body_timeout_ms: int = 60000  # the longest wait between two reads of a request's body: 408
    # bytes of request bodies still arriving, over one port's connections (0: the larger of 1 GiB and 4 x
    # max_request_size): a body that would pass it gets 503 at once
    max_incoming_bytes: int = 0
    max_tensor_elements: int = 16_777_216  # one tensor's elements (a 0 dimension counted as 1): 413
    max_tensor_dims: int = 32  # one tensor's dimensions: 413
    max_empty_tensor_span: int = 65536  # an empty tensor's other dimensions multiplied (its nested form's lists): 413
    ts_open_inference_protocol: bool = False  # TorchServe's switch for OIP; servetune serves OIP REST regardless

    @classmethod
    def load(
        cls,
        config_file: Path | None = None,
        *,
        cli: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ServerConfig:
        """Merge defaults < file < environment (only if enabled) < CLI, then validate."""
        environ = os.environ if environ is None else environ
        if config_file is None and environ.get("TS_CONFIG_FILE"):
            config_file = Path(environ["TS_CONFIG_FILE"])
        raw: dict[str, str] = dict(read_properties(config_file)) if config_file is not None else {}
        env_enabled = _bool("enable_envvars_config", environ.get("TS_ENABLE_ENVVARS_CONFIG", "false")) or _bool(
            "enable_envvars_config", raw.get("enable_envvars_config", "false")
        )
        if env_enabled:
            for key in _known_keys():
                env_key = f"TS_{key.upper()}"
                if env_key in environ:
                    raw[key] = environ[env_key]
        oip = environ.get("TS_OPEN_INFERENCE_PROTOCOL")
        if oip:  # read by TorchServe whatever enable_envvars_config says: "oip" turns it on
            raw["ts_open_inference_protocol"] = str(oip == "oip").lower()
        raw.update(cli or {})
        return cls.from_properties(raw)

    @classmethod
    def from_properties(cls, raw: Mapping[str, str]) -> ServerConfig:
        """Validate raw key/value strings. Relative paths are relative to the working directory, as in TorchServe."""
        values: dict[str, Any] = {}
        ignored: list[str] = []
        for key, value in raw.items():
            if key in ("inference_address", "management_address", "metrics_address"):
                values[key] = Address.parse(key, value)
            elif key == "model_store":
                values[key] = Path(value).expanduser().absolute()
            elif key == "load_models":
                values[key] = tuple(part.strip() for part in value.split(",") if part.strip())
            elif key == "models":
                values[key] = _parse_models_json(value)
            elif key == "model_snapshot":
                values[key] = _parse_snapshot(value)
            elif key == "allowed_urls":
                values[key] = tuple(part for part in (p.strip() for p in value.split(",")) if part)
            elif key == "number_of_gpu":
                values[key] = _int(key, value)
            elif key in ("key_file",):
                values[key] = Path(value)
            elif key in ("grpc_inference_address", "grpc_management_address"):
                values[key] = _host(key, value)
            elif key == "enable_grpc_ssl":
                if _bool(key, value):
                    raise ConfigError(f"{key}={value!r}: TLS on gRPC is not supported; terminate TLS in a proxy")
            elif key in ("grpc_inference_port", "grpc_management_port"):
                values[key] = _int(key, value)
                if values[key] > 65535:
                    raise ConfigError(f"{key}={value!r}: port must be 0..65535")
            elif key == "service_envelope":
                if value.strip() not in SERVICE_ENVELOPES + ("",):
                    raise ConfigError(f"{key}={value!r}: expected one of {', '.join(SERVICE_ENVELOPES)}")
                values[key] = value.strip() or None
            elif key == "worker_preload":
                if value.strip() not in WORKER_PRELOAD:
                    raise ConfigError(f"{key}={value!r}: expected one of {', '.join(WORKER_PRELOAD)}")
                values[key] = value.strip()
            elif key == "cors_allowed_origin":
                values[key] = value
            elif key == "cpu_launcher_args":
                launcher_threads(value)  # refuse what servetune does not do, now
                values[key] = value
            elif key == "shutdown_grace_period":
                try:
                    values[key] = float(value)
                except ValueError:
                    raise ConfigError(f"{key}={value!r}: expected seconds") from None
            elif key in _INT_KEYS:
                values[key] = _int(key, value, minimum=_INT_KEYS[key])
                if key in _INT_MAXIMA and values[key] > _INT_MAXIMA[key]:
                    raise ConfigError(f"{key}={value!r}: must be <= {_INT_MAXIMA[key]}")
            elif key in _BOOL_KEYS:
                values[key] = _bool(key, value)
            elif key in _ACCEPTED_NOT_USED or key in ("enable_envvars_config",):
                if key != "enable_envvars_config":
                    ignored.append(key)
            else:
                ignored.append(key)
        if ignored:
            log.warning("config keys accepted but not used by servetune: %s", ", ".join(sorted(ignored)))
        for pattern in values.get("allowed_urls", ()):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"allowed_urls: {pattern!r} is not a valid regular expression: {exc}") from None
        config = cls(**values)
        if 0 < config.max_incoming_bytes < config.max_request_size:
            raise ConfigError(
                f"max_incoming_bytes={config.max_incoming_bytes} is less than max_request_size="
                f"{config.max_request_size}: a body of the largest size allowed could never arrive"
            )
        if config.default_workers_per_model > config.max_workers_per_model:
            raise ConfigError(
                f"default_workers_per_model={config.default_workers_per_model} is more than "
                f"max_workers_per_model={config.max_workers_per_model}"
            )
        return config

    def with_overrides(self, **changes: Any) -> ServerConfig:
        return replace(self, **changes)

    @property
    def incoming_bytes(self) -> int:
        """``max_incoming_bytes``, or its default: the larger of 1 GiB and four bodies of ``max_request_size``."""
        return self.max_incoming_bytes or max(1 << 30, 4 * self.max_request_size)

    @property
    def tensor_limits(self) -> TensorLimits:
        """What one tensor of a request may claim (``max_tensor_*``)."""
        return TensorLimits(self.max_tensor_elements, self.max_tensor_dims, self.max_empty_tensor_span)

    @property
    def token_auth(self) -> bool:
        return not self.disable_token_authorization

    @property
    def default_threads(self) -> int:
        """Intra-op threads per worker when a model names none: ``threads_per_worker``, else the launcher's
        ``--ncores_per_instance``, else 0 (the physical cores shared by every worker)."""
        return self.threads_per_worker or launcher_threads(self.cpu_launcher_args)


# TorchServe's ``cpu_launcher_args`` (its ``torch.backends.xeon.run_cpu`` flags): what each means here.
_LAUNCHER_FLAGS_ACCEPTED = ("--use_logical_core",)  # servetune pins to the logical CPUs of its affinity mask
_LAUNCHER_FLAGS_REFUSED = {
    "--ninstances": "set the model's workers (minWorkers) instead",
    "--node_id": "NUMA node selection is not supported; start servetune under numactl instead",
    "--skip_cross_node_cores": "NUMA node selection is not supported; start servetune under numactl instead",
    "--disable_numactl": "servetune does not run numactl",
    "--disable_iomp": "servetune does not preload Intel OpenMP; set LD_PRELOAD yourself",
    "--enable_tcmalloc": "servetune does not preload allocators; set LD_PRELOAD yourself",
    "--enable_jemalloc": "servetune does not preload allocators; set LD_PRELOAD yourself",
    "--use_default_allocator": "servetune does not preload allocators",
    "--multi_instance": "set the model's workers (minWorkers) instead",
    "--latency_mode": "set numThreads and minWorkers instead",
    "--throughput_mode": "set numThreads and minWorkers instead",
}


def launcher_threads(args: str) -> int:
    """``cpu_launcher_args``: ``--ncores_per_instance N`` -> N threads per worker (0 when absent). Flags servetune
    cannot honour are refused by name rather than silently ignored."""
    tokens = args.split()
    threads = 0
    i = 0
    while i < len(tokens):
        flag, _, inline = tokens[i].partition("=")
        if flag == "--ncores_per_instance":
            raw = inline or (tokens[i + 1] if i + 1 < len(tokens) else "")
            i += 1 if inline else 2
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"cpu_launcher_args: --ncores_per_instance {raw!r}: expected an integer >= 1")
            threads = int(raw)
            continue
        if flag in _LAUNCHER_FLAGS_ACCEPTED:
            i += 1
            continue
        why = _LAUNCHER_FLAGS_REFUSED.get(flag, "not a launcher flag servetune knows")
        raise ConfigError(f"cpu_launcher_args: {flag} is not supported: {why}")
    return threads


_INT_KEYS = {
    "grpc_inference_max_connection_age_ms": 0,
    "grpc_management_max_connection_age_ms": 0,
    "grpc_inference_max_connection_age_grace_ms": 0,
    "grpc_management_max_connection_age_grace_ms": 0,
    "default_workers_per_model": 0,
    "job_queue_size": 1,
    "max_request_size": 1,
    "max_response_size": 1,
    "default_response_timeout": 1,
    "default_startup_timeout": 1,
    "token_expiration_min": 1,
    "threads_per_worker": 0,
    "max_workers_per_model": 1,
    "max_header_line_size": 64,
    "max_header_size": 64,
    "max_header_count": 1,
    "header_timeout_ms": 1,
    "body_timeout_ms": 1,
    "max_incoming_bytes": 0,
    "max_tensor_elements": 1,
    "max_tensor_dims": 1,
    "max_empty_tensor_span": 1,
}
# What numpy can hold: a larger limit would let a shape through that numpy refuses (a 500, not a 413).
_INT_MAXIMA = {"max_tensor_dims": 64, "max_tensor_elements": 2**62, "max_empty_tensor_span": 2**62}
_BOOL_KEYS = frozenset(
    {
        "enable_model_api",
        "enable_metrics_api",
        "disable_token_authorization",
        "inference_token_authorization",
        "open_ping",
        "limit_max_image_pixels",
        "decode_input_request",
        "cpu_launcher_enable",
        "ts_open_inference_protocol",
    }
)


def _known_keys() -> list[str]:
    return [f.name for f in fields(ServerConfig)] + ["enable_grpc_ssl"] + sorted(_ACCEPTED_NOT_USED)


def _parse_snapshot(value: str) -> dict[str, Any]:
    """The ``models`` of a TorchServe snapshot, each version naming its archive (``marName``)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model_snapshot={value[:80]!r}: not valid JSON ({exc.msg} at char {exc.pos})") from None
    models = parsed.get("models") if isinstance(parsed, dict) else None
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        raise ConfigError('model_snapshot: expected {"models": {"<name>": {"<version>": {"marName": ..., ...}}}}')
    for name, versions in models.items():
        for version, entry in versions.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("marName"), str) or not entry["marName"]:
                raise ConfigError(f"model_snapshot: models[{name}][{version}]: expected an object with a marName")
    return models


def _parse_models_json(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"models={value[:80]!r}: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ConfigError('models: expected {"<name>": {"<version>": {...}}}')
    return parsed
