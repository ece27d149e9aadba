"""Deployable artifacts for the winner, in ``<study folder>/deploy/``:

- ``model-store/<model>/``: the model archive (folder format) whose model-config.yaml carries the winning settings;
- ``model-config.yaml``: the same settings, for ``torch-model-archiver --config-file`` when rebuilding a .mar;
- ``config.properties``: a server config that loads that archive at start (``models=`` repeats the settings);
- ``serve-command.txt``: the exact ``servetune serve`` command;
- with ``backend: ray``, ``ray-serve-config.yaml`` too: the same deployment as a Ray Serve config for ``serve deploy``
  (or KubeRay's ``serveConfigV2``), as ``servetune serve --backend ray --ray-serve-config`` writes it; the command
  serves it through the Ray backend's driver (``servetune serve --backend ray``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servetune.archive import open_archive
from servetune.tune.archives import trial_model_config, write_archive
from servetune.tune.study import Config, Study
from servetune.tune.target import queue_size

RAY_SERVE_CONFIG = "ray-serve-config.yaml"
RAY_SERVE_ADDRESS = "http://0.0.0.0:8000"


@dataclass(frozen=True)
class Deployment:
    folder: Path
    serve_command: str
    config_properties: Path
    model_config: Path
    ray_serve_config: Path | None = None  # backend ray: for ``serve deploy`` on a running cluster


def knobs(config: Config) -> dict[str, int]:
    return {
        "batchSize": config.batch_size,
        "maxBatchDelay": config.batch_delay_ms,
        "minWorkers": config.workers,
        "maxWorkers": config.workers,
    }


def write_deployment(study: Study, winner: Config, out_dir: Path, *, served_url: str | None = None) -> Deployment:
    """Write the artifacts. ``served_url`` is set when tuning a running server (``--url``): its archive stays where
    it is, and only the settings are written."""
    folder = out_dir / "deploy"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    family = study.family(winner.family)
    settings = knobs(winner)
    properties: dict[str, str] = {"job_queue_size": str(queue_size(winner.workers, winner.batch_size))}
    properties.update(study.server)
    if served_url is None:
        with tempfile.TemporaryDirectory(prefix="servetune-deploy-") as tmp:
            source = open_archive(family.archive, Path(tmp) / "x")
            config: dict[str, Any] = {**trial_model_config(source.model_config, family), **settings}
            store = folder / "model-store"
            write_archive(source, store / study.model, config)
            version = str(source.manifest.raw.get("model", {}).get("modelVersion") or "1.0")
        properties.update({"model_store": str(store.resolve()), "load_models": f"{study.model}={study.model}"})
    else:
        config = dict(settings)
        version = "1.0"
        properties["load_models"] = f"{study.model}={served_url}"
    properties["models"] = json.dumps({study.model: {version: settings}})
    model_config = folder / "model-config.yaml"
    model_config.write_text(yaml.safe_dump(config, sort_keys=False))
    config_properties = folder / "config.properties"
    header = f"# servetune tune: the winning deployment of {study.model}: {winner.key}\n"
    config_properties.write_text(header + "".join(f"{k}={v}\n" for k, v in properties.items()))
    command = f"servetune serve --ts-config {config_properties.resolve()}"
    if served_url is not None:
        command += " --model-store <the server's model store>"
    lines = [command]
    ray_file = None
    if study.backend == "ray":
        address = f" --ray-address {study.ray_address}" if study.ray_address else ""
        command = command.replace("servetune serve ", f"servetune serve --backend ray{address} ", 1)
        lines = [command]
        if served_url is None:
            ray_file = write_ray_serve_config(config_properties, folder / RAY_SERVE_CONFIG)
            lines.append(f"# or, on a running Ray cluster (no servetune driver): serve deploy {ray_file.resolve()}")
    (folder / "serve-command.txt").write_text("\n".join(lines) + "\n")
    return Deployment(folder, command, config_properties, model_config, ray_file)


def write_ray_serve_config(config_properties: Path, path: Path) -> Path:
    """The deployment of ``config_properties`` as a Ray Serve config, listening on every interface at Ray Serve's
    port (8000), with a proxy on every node: what ``serve deploy`` / KubeRay want on a cluster."""
    from servetune.config.server import ServerConfig
    from servetune.ray import export_serve_config

    config = ServerConfig.load(config_properties, cli={"inference_address": RAY_SERVE_ADDRESS}, environ={})
    return export_serve_config(config, (), path)
