"""Deployable artifacts for the winner, in ``<study folder>/deploy/``:

- ``model-store/<model>/``: the model archive (folder format) whose model-config.yaml carries the winning settings
  (an app: one per model, all served by one server);
- ``model-config.yaml`` (an app: ``model-config.<model>.yaml``): the same settings, for ``torch-model-archiver
  --config-file`` when rebuilding a .mar;
- ``model-config.controller.yaml`` (an app: ``model-config.<model>.controller.yaml``): the same settings with the online
  controller switched on (docs/controller.md): the study's SLA, the searched ranges as its bounds, shedding on; for
  a load that moves, where one static config cannot hold the SLA at every level (native; on Ray, each replica's
  controller moves its batch size and delay, and the replicas are Ray's to scale);
- ``config.properties``: a server config that loads the archives at start (``models=`` repeats the settings);
- ``serve-command.txt``: the exact ``servetune serve`` command, and other ways to serve it;
- whatever the study's backend adds (``targets/``): on Ray, ``ray-serve-config.yaml`` for ``serve deploy``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servetune.archive import open_archive
from servetune.tune.archives import trial_model_config, write_archive
from servetune.tune.study import Config, Family, Point, Sla, Study
from servetune.tune.targets import target_kind
from servetune.tune.targets.base import queue_size


@dataclass(frozen=True)
class Deployment:
    folder: Path
    serve_command: str
    config_properties: Path
    model_config: Path
    alternatives: tuple[str, ...] = ()  # other ways to serve it (e.g. ``serve deploy FILE`` on a Ray cluster)
    files: Mapping[str, Path] = field(default_factory=dict)  # extra files the backend wrote, by name
    model_configs: Mapping[str, Path] = field(default_factory=dict)  # each model's model-config.yaml, by model


def knobs(config: Config) -> dict[str, int | bool]:
    """The model-config.yaml (and ``models=``) settings of one model's config; threads and pinning when set."""
    settings: dict[str, int | bool] = {
        "batchSize": config.batch_size,
        "maxBatchDelay": config.batch_delay_ms,
        "minWorkers": config.workers,
        "maxWorkers": config.workers,
    }
    if config.threads:
        settings["numThreads"] = config.threads
    if config.inter_op_threads:
        settings["interOpThreads"] = config.inter_op_threads
    if config.pinning:
        settings["cpuPinning"] = True
    return settings


CONTROLLER_KNOBS = ("batch_size", "max_batch_delay_ms", "workers", "threads")


def controller_section(sla: Sla, family: Family, moves: tuple[str, ...] = CONTROLLER_KNOBS) -> dict[str, Any] | None:
    """The model-config.yaml ``controller:`` section for this family: its SLA (the per-request deadline's key), the
    ranges the study searched as the bounds of the knobs the backend's controller ``moves`` (threads per worker too,
    when it searched more than one explicit count), shedding on; None when the study has no latency SLA."""
    limits = dict(sla.limits())
    key = next((k for k in ("p95_ms", "p99_ms", "mean_ms") if k in limits), None)
    if key is None:
        return None
    bounds: dict[str, list[int]] = {
        "batch_size": [min(family.batch_sizes), max(family.batch_sizes)],
        "max_batch_delay_ms": [min(family.batch_delays_ms), max(family.batch_delays_ms)],
        "workers": [max(1, min(family.workers)), max(family.workers)],
    }
    threads = sorted({t for t in family.threads if t > 0})  # 0: the server's automatic share, not a bound
    if len(threads) > 1:  # searched: the controller moves them too
        bounds["threads"] = [threads[0], threads[-1]]
    moved = {knob: bound for knob, bound in bounds.items() if knob in moves}
    return {"slo": {key: limits[key]}, "bounds": moved, "shed": True}


def write_deployment(
    study: Study, winner: Point, out_dir: Path, *, served_url: str | None = None, controller: bool = False
) -> Deployment:
    """Write the artifacts (every model of an app in one server). ``served_url`` is set when tuning a running
    server (``--url``): its archive stays where it is, and only the settings are written. ``controller``: the
    online controller beat the static winner on the study's trace (``online.py``): it is switched on in the
    deployed settings (the archive's model-config.yaml and model-config.yaml), and no separate file offers it."""
    folder = out_dir / "deploy"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    kind = target_kind(study.backend)
    widest = max(queue_size(part.workers, part.batch_size) for part in winner.parts)
    properties: dict[str, str] = {"job_queue_size": str(widest)}
    properties.update(study.server)
    store = folder / "model-store"
    loads, models, configs = [], {}, {}
    extra: dict[str, Path] = {}  # the controller's model-config.yaml files
    for name, part in zip(study.model_names, winner.parts, strict=True):
        family = study.family(part.family)
        settings = knobs(part)
        sla = study.model_spec(name).sla if study.is_app else study.sla
        section = controller_section(sla, family, kind.controller_knobs) if kind.controller_knobs else None
        switched_on = {"controller": section} if section is not None and controller else {}
        if served_url is None:
            with tempfile.TemporaryDirectory(prefix="servetune-deploy-") as tmp:
                source = open_archive(family.archive, Path(tmp) / "x")
                base = trial_model_config(source.model_config, family, kind.model_config(family))
                config: dict[str, Any] = {**base, **settings, **switched_on}
                write_archive(source, store / name, config)
                version = str(source.manifest.raw.get("model", {}).get("modelVersion") or "1.0")
            loads.append(f"{name}={name}")
        else:
            config, version = {**settings, **switched_on}, "1.0"
            loads.append(f"{name}={served_url}")
        models[name] = {version: settings}
        configs[name] = folder / ("model-config.yaml" if not study.is_app else f"model-config.{name}.yaml")
        configs[name].write_text(yaml.safe_dump(config, sort_keys=False))
        if section is not None and not switched_on:
            controlled = configs[name].with_name(configs[name].name.replace(".yaml", ".controller.yaml"))
            controlled.write_text(yaml.safe_dump({**config, "controller": section}, sort_keys=False))
            extra[controlled.name] = controlled
    if served_url is None:
        properties["model_store"] = str(store.resolve())
    properties["load_models"] = ",".join(loads)
    properties["models"] = json.dumps(models)
    model_config = configs[study.model_names[0]]
    config_properties = folder / "config.properties"
    header = f"# servetune tune: the winning deployment of {study.model}: {winner.key}\n"
    config_properties.write_text(header + "".join(f"{k}={v}\n" for k, v in properties.items()))
    command = f"servetune serve --ts-config {config_properties.resolve()}"
    if served_url is not None:
        command += " --model-store <the server's model store>"
    deployed = kind.deploy(study, config_properties, command, packaged=served_url is None)
    lines = [deployed.command, *(f"# or, {alternative}" for alternative in deployed.alternatives)]
    if extra:
        lines.append(f"# for a load that moves: rebuild the archive with {', '.join(extra)} (the online controller)")
    if controller:
        lines.append("# the online controller is on: it beat the static winner on the study's trace (report.md)")
    (folder / "serve-command.txt").write_text("\n".join(lines) + "\n")
    files = {**deployed.files, **extra}
    return Deployment(folder, deployed.command, config_properties, model_config, deployed.alternatives, files, configs)
