"""TorchServe's auto-benchmark model config (``benchmarks/models_config/*.yaml``), accepted unchanged.

    vgg16:                              # model name
      eager_mode:                       # mode: one archive to try
        benchmark_engine: "ab"
        url: "vgg16.mar"
        workers: [1, 4]
        batch_delay: 100
        batch_size: [1, 2, 4, 8]
        requests: 10000
        concurrency: 10
        input: "kitten.jpg"
        backend_profiling: False
        exec_env: "local"
        processors: ["cpu", {"gpus": "all"}]

TorchServe's ``gen_model_config_json.py`` silently drops keys it does not know; here every key is either honoured
or refused with a message that names it. Each (model, mode, processor) becomes one family of the search space;
the load is TorchServe's: a fixed ``concurrency`` in closed loop for ``requests`` requests after a warm-up of a
tenth of them. The form carries no SLA: give one with ``--sla-p99`` (without it, configs are ranked by
throughput alone).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError
from servetune.tune import _values as v
from servetune.tune.study import Family, Load, Study

KNOWN = (
    "benchmark_engine", "url", "workers", "batch_delay", "batch_size", "input", "requests", "concurrency",
    "content_type", "backend_profiling", "handler_profiling", "exec_env", "processors", "timeout_ms",
)  # fmt: skip
# TorchServe keys servetune cannot honour, and why.
REFUSED = {
    "retry_attempts": "workflows (.war files) are not supported; retry_attempts only applies to them",
    "image": "servetune tune runs locally, not in docker (exec_env: local)",
    "docker_runtime": "servetune tune runs locally, not in docker (exec_env: local)",
    "gpus": "give GPUs as processors: [{gpus: all}]",
    "config_properties": "give server settings in servetune's study format (server: {...})",
    "inference_model_url": "the tuner serves the model itself under /predictions/<model>",
    "report_location": "the study folder (--out) holds every report",
    "tmp_dir": "the study folder (--out) holds every file",
    "generate_graphs": "plots are always written when matplotlib is installed",
    "benchmark_backend": "use benchmark_engine",
}
# benchmark-ab.py's defaults for keys a mode leaves out
DEFAULTS: dict[str, Any] = {"workers": [1], "batch_size": [1], "batch_delay": 200, "requests": 100, "concurrency": 10}


def parse(raw: Mapping[str, Any], source: Path, devices: set[str]) -> Study:
    base = source.parent
    families: list[Family] = []
    notes: list[str] = []
    several = len(raw) > 1
    for model, modes in raw.items():
        if not isinstance(model, str):
            raise v.fail("<model name>", model, "a model name")
        if not isinstance(modes, Mapping) or not modes:
            raise ConfigError(
                f"{model}: expected a mapping of benchmark modes (e.g. eager_mode: {{url: ..., ...}}), got {modes!r}"
                " (servetune's own study form needs an 'archive' key)"
            )
        for mode, settings in modes.items():
            prefix = f"{mode}_{model}" if several else str(mode)
            families += _families(f"{model}.{mode}", prefix, v.mapping(f"{model}.{mode}", settings), base, devices,
                                  notes)  # fmt: skip
    if not families:
        raise ConfigError(f"{source}: no processor listed is available on this host ({'; '.join(notes)})")
    model_name = str(next(iter(raw)))
    if several:
        notes.append(f"several models in one file: each is one more choice; the winner is served as {model_name!r}")
    return Study(
        model=model_name,
        families=tuple(families),
        baseline_family=families[0],
        form="torchserve",
        source=source.resolve(),
        notes=tuple(dict.fromkeys(notes)),
    )


def _families(
    where: str, prefix: str, settings: Mapping[str, Any], base: Path, devices: set[str], notes: list[str]
) -> list[Family]:
    for key in settings:
        if key in REFUSED:
            raise ConfigError(f"{where}.{key}: not supported by servetune tune: {REFUSED[key]}")
    v.check_keys(where, settings, KNOWN)
    if "url" not in settings:
        raise ConfigError(f"{where}.url: missing; expected the model archive's path")
    values = {**DEFAULTS, **settings}
    if v.boolean(f"{where}.backend_profiling", values.get("backend_profiling", False)):
        raise ConfigError(
            f"{where}.backend_profiling=True: not supported (servetune has no cProfile backend profiling)"
        )
    exec_env = values.get("exec_env", "local")
    if exec_env != "local":
        raise v.fail(f"{where}.exec_env", exec_env, "'local' (servetune tune does not run docker)")
    model_config: dict[str, Any] = {}
    if v.boolean(f"{where}.handler_profiling", values.get("handler_profiling", False)):
        model_config["handler"] = {"profile": True}
    engine = values.get("benchmark_engine", "ab")
    if engine not in ("ab", "async"):
        raise v.fail(f"{where}.benchmark_engine", engine, "'ab' (servetune also offers 'async')")
    if engine == "ab" and shutil.which("ab") is None:
        notes.append("benchmark_engine 'ab': Apache Bench is not installed; using servetune's async engine instead")
        engine = "async"
    requests = v.integer(f"{where}.requests", values["requests"])
    load = Load(
        mode="concurrency",
        concurrency=v.integer(f"{where}.concurrency", values["concurrency"]),
        requests=requests,
        duration_s=None,
        warmup_s=0.0,
        warmup_requests=requests // 10,
        engine=engine,
        timeout_s=v.number(f"{where}.timeout_ms", values["timeout_ms"]) / 1000 if "timeout_ms" in values else 300.0,
    )
    archive = v.path(f"{where}.url", values["url"], base)
    common: dict[str, Any] = {
        "archive": archive,
        "optimization": "eager",
        "workers": v.integers(f"{where}.workers", values["workers"]),
        "batch_sizes": v.integers(f"{where}.batch_size", values["batch_size"]),
        "batch_delays_ms": v.integers(f"{where}.batch_delay", values["batch_delay"], minimum=0),
        "load": load,
        "input": v.path(f"{where}.input", values["input"], base) if values.get("input") is not None else None,
        "content_type": v.text(f"{where}.content_type", values["content_type"]) if "content_type" in values else None,
        "model_config": model_config,
    }
    out: list[Family] = []
    processors = values.get("processors", ["cpu"])
    for i, processor in enumerate(processors if isinstance(processors, list) else [processors]):
        device, gpus = _processor(f"{where}.processors[{i}]", processor)
        if device not in devices:
            notes.append(f"{where}.processors[{i}]={processor!r} skipped: this host has no CUDA")
            continue
        out.append(Family(label=f"{prefix}/{device}", device=device, gpus=gpus, **common))
    return out


def _processor(where: str, value: Any) -> tuple[str, int | None]:
    if value == "cpu":
        return "cpu", None
    if isinstance(value, Mapping) and list(value) == ["gpus"]:
        gpus = value["gpus"]
        if gpus == "all":
            return "cuda", None
        return "cuda", v.integer(f"{where}.gpus", gpus)
    if value in ("neuron", "neuronx"):
        raise ConfigError(f"{where}={value!r}: AWS Inferentia is not supported by servetune")
    raise v.fail(where, value, "'cpu' or {gpus: all} or {gpus: N}")
