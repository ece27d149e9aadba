"""Per-model settings: TorchServe's ``model-config.yaml`` keys and the register API's parameters.

Precedence (TorchServe's): ``models=`` JSON in config.properties < model-config.yaml in the archive
< management API parameters. Keys the frontend does not know reach the handler as ``model_yaml_config``.

Every source of a setting has the same bounds and the same refusal (:func:`out_of_range`): ``batchSize`` in an
archive, in ``models=`` and ``batch_size`` on the API (REST or gRPC) all stop at :data:`LIMIT`; workers at the
server's ``max_workers_per_model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from servetune._exceptions import ConfigError

DEFAULT_BATCH_SIZE = 1
DEFAULT_MAX_BATCH_DELAY_MS = 100
LIMIT = 1_000_000  # the largest batch size, delay, timeout, queue or thread count, from any source
JAVA_INT_MAX = 2**31 - 1  # TorchServe reads every integer setting into a Java int
# How a model's workers start (docs/server.md "Workers"): forked from a parent that loaded the model once (``model``,
# where it is safe; ``auto`` does so for models whose code uses torch), from one that only imported the handler's
# modules (``imports``), or each as a fresh interpreter (``off``).
WORKER_PRELOAD = ("auto", "model", "imports", "off")

# model-config.yaml key -> (ModelConfig field, minimum, maximum); a maximum of None: the server's max_workers_per_model.
# The minimums are the management API's for the same setting (startup_timeout=0 is accepted there, as in TorchServe).
_YAML_KEYS: dict[str, tuple[str, int, int | None]] = {
    "minWorkers": ("min_workers", 0, None),
    "maxWorkers": ("max_workers", 0, None),
    "batchSize": ("batch_size", 1, LIMIT),
    "maxBatchDelay": ("max_batch_delay_ms", 0, LIMIT),
    "responseTimeout": ("response_timeout_s", 1, LIMIT),
    "startupTimeout": ("startup_timeout_s", 0, LIMIT),
    "jobQueueSize": ("job_queue_size", 1, LIMIT),
    "numThreads": ("num_threads", 0, LIMIT),
    "interOpThreads": ("inter_op_threads", 0, LIMIT),
    "clientTimeoutInMills": ("client_timeout_ms", 0, JAVA_INT_MAX),
}


def shown(value: object, width: int = 24) -> str:
    """A value as an error message quotes it: long ones cut, with their length."""
    text = str(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} characters)"


def out_of_range(key: str, value: object, minimum: int, maximum: int, *, workers: bool = False) -> str:
    """The one wording of a setting outside its bounds, whichever source it came from (the caller prefixes the
    source where it is a file)."""
    text = f"{key} must be between {minimum} and {maximum}, got {shown(value)}"
    return f"{text} (max_workers_per_model={maximum})" if workers else text


@dataclass(frozen=True)
class ModelConfig:
    """Settings of one model version. ``None`` means "use the server default"."""

    batch_size: int = DEFAULT_BATCH_SIZE
    max_batch_delay_ms: int = DEFAULT_MAX_BATCH_DELAY_MS
    min_workers: int | None = None
    max_workers: int | None = None
    response_timeout_s: int | None = None
    startup_timeout_s: int | None = None
    job_queue_size: int | None = None
    device_type: str | None = None  # "cpu" | "gpu"
    device_ids: tuple[int, ...] = ()
    num_threads: int = 0  # intra-op threads per worker; 0: the physical cores shared by every worker
    inter_op_threads: int = 0  # 0: torch's default; set when a worker starts
    cpu_pinning: bool | None = None  # each worker on its own cores (os.sched_setaffinity); None: the server default
    worker_preload: str | None = None  # one of WORKER_PRELOAD; None: the server default (``worker_preload``)
    client_timeout_ms: int = 0
    handler_config: Mapping[str, Any] = field(default_factory=dict)  # the whole YAML, as the handler sees it

    def merged(self, other: Mapping[str, Any], *, source: str, max_workers: int = LIMIT) -> ModelConfig:
        """Return a copy with the model-config.yaml style keys of ``other`` applied on top; ``max_workers`` bounds
        ``minWorkers``/``maxWorkers`` (the server's ``max_workers_per_model``)."""
        changes: dict[str, Any] = {}
        for key, value in other.items():
            if key in _YAML_KEYS:
                name, minimum, maximum = _YAML_KEYS[key]
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"{source}: {key} must be an integer, got {shown(repr(value))}")
                bound = max_workers if maximum is None else maximum
                if not minimum <= value <= bound:
                    message = out_of_range(key, value, minimum, bound, workers=maximum is None)
                    raise ConfigError(f"{source}: {message}")
                changes[name] = value
            elif key == "deviceType":
                if value not in ("cpu", "gpu"):
                    raise ConfigError(f"{source}: deviceType={value!r}: expected 'cpu' or 'gpu'")
                changes["device_type"] = value
            elif key == "cpuPinning":
                if not isinstance(value, bool):
                    raise ConfigError(f"{source}: cpuPinning={value!r}: expected true or false")
                changes["cpu_pinning"] = value
            elif key == "workerPreload":
                if value not in WORKER_PRELOAD:
                    raise ConfigError(
                        f"{source}: workerPreload={shown(repr(value))}: expected one of {', '.join(WORKER_PRELOAD)}"
                    )
                changes["worker_preload"] = value
            elif key == "deviceIds":
                if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
                    raise ConfigError(f"{source}: deviceIds={value!r}: expected a list of GPU indices")
                changes["device_ids"] = tuple(value)
        handler_config = {**self.handler_config, **other}
        merged = replace(self, handler_config=handler_config, **changes)
        if (
            merged.min_workers is not None
            and merged.max_workers is not None
            and merged.max_workers < merged.min_workers
        ):
            raise ConfigError(f"{source}: maxWorkers={merged.max_workers} is less than minWorkers={merged.min_workers}")
        return merged

    def with_api_params(self, **params: Any) -> ModelConfig:
        """Apply management API parameters (already type-checked by the API layer); None leaves a value."""
        return replace(self, **{k: v for k, v in params.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        raw = {f.name: getattr(self, f.name) for f in fields(self)}
        raw["device_ids"] = list(self.device_ids)
        raw["handler_config"] = dict(self.handler_config)
        return raw

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ModelConfig:
        values = {k: v for k, v in raw.items() if k in {f.name for f in fields(cls)}}
        values["device_ids"] = tuple(values.get("device_ids") or ())
        return cls(**values)


def models_json_entry(entry: Mapping[str, Any], *, source: str, max_workers: int = LIMIT) -> ModelConfig:
    """Read one version entry of config.properties' ``models=`` JSON (same camelCase keys and bounds as the YAML)."""
    # ``controller`` (the online controller's settings, servetune's) travels on as the YAML's section does
    extra = ("deviceType", "deviceIds", "cpuPinning", "workerPreload", "controller")
    known = {k: v for k, v in entry.items() if k in _YAML_KEYS or k in extra}
    return ModelConfig().merged(known, source=source, max_workers=max_workers)
