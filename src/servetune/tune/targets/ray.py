"""Ray Serve as the trials' target (``backend: ray``): everything the tuner knows about Ray lives here.

- ``ray_address``: a running cluster (HOST:PORT of its head's GCS, or ``auto``); without one, the tuner's server
  starts a private local Ray instance and stops it with itself.
- How many batches' worth of requests a replica holds (model-config ``rayOngoingBatches``) is a knob of its own on
  Ray: Ray's router may queue a batch behind a busy replica while another idles (one is best), and two keep a busy
  replica fed. Each family is searched with every value of ``space.ray_ongoing_batches`` (default 1 and 2) unless
  the study's model_config sets ``rayOngoingBatches``; the default config keeps the server's default (2).
- The winner is also written as a Ray Serve config for ``serve deploy`` (or KubeRay's serveConfigV2).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError
from servetune.tune import _values as v
from servetune.tune.study import Family, Study
from servetune.tune.targets.base import Deployed, Target, TargetKind
from servetune.tune.targets.native import EmbeddedTarget

ONGOING_BATCHES = (1, 2)  # searched unless the study says otherwise
OPTION = "ray_ongoing_batches"  # the study option (space key) ...
FAMILY_OPTION = "ongoing_batches"  # ... the family option it becomes ...
MODEL_CONFIG_KEY = "rayOngoingBatches"  # ... and the model-config key the server reads
RAY_SERVE_CONFIG = "ray-serve-config.yaml"
RAY_SERVE_ADDRESS = "http://0.0.0.0:8000"
_ADDRESS = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$")


class RayKind(TargetKind):
    name = "ray"
    label = "Ray Serve"
    address_key = "ray_address"
    address_hint = "HOST:PORT of a running Ray cluster, or auto"
    space_keys = (OPTION,)
    # each replica's controller moves its own batching; replicas and threads are Ray's (docs/controller.md)
    controller_knobs = ("batch_size", "max_batch_delay_ms")

    def read(self, space: Mapping[str, Any], model_config: Mapping[str, Any]) -> dict[str, Any]:
        if OPTION not in space:
            return {}
        from servetune.ray import MAX_ONGOING_BATCHES

        values = v.integers(f"space.{OPTION}", space[OPTION])
        if values[-1] > MAX_ONGOING_BATCHES:
            raise v.fail(f"space.{OPTION}", space[OPTION], f"whole numbers 1..{MAX_ONGOING_BATCHES}")
        if isinstance(model_config, Mapping) and MODEL_CONFIG_KEY in model_config:
            raise ConfigError(
                f"space.{OPTION} and model_config.{MODEL_CONFIG_KEY}: set one (a list to search, or one value)"
            )
        return {OPTION: values}

    def check_address(self, address: str) -> None:
        match = _ADDRESS.match(address)
        if address != "auto" and (match is None or not 0 < int(match.group(1)) < 65536):
            raise ConfigError(
                f"ray_address={address!r}: expected HOST:PORT of a running Ray cluster's head "
                "(its GCS port, 6379 by default), or auto"
            )

    def check(self, study: Study) -> None:
        """Ray runs servetune's form only, with server settings its driver can honour, and must be installed."""
        if study.form != "servetune":
            raise ConfigError(
                "backend='ray': TorchServe's auto-benchmark form runs on the native server; "
                "write a servetune study (docs/tune.md) to tune on Ray"
            )
        from servetune.config.server import ServerConfig
        from servetune.ray import check_config, require_ray

        try:
            check_config(ServerConfig.from_properties(dict(study.server)))
        except ConfigError as exc:
            raise ConfigError(f"server: {exc}") from None
        if any(True in family.pinning for family in study.families):
            raise ConfigError("space.pinning: true is not supported on the Ray backend (Ray places replicas)")
        require_ray()

    def drop(self, study: Study, where: str) -> Study:
        if OPTION not in study.options:
            return study
        if where == "--url":
            note = f"--url: space.{OPTION} ignored: a replica holds what the server was deployed with"
        else:
            note = f"space.{OPTION} ignored: the {where} server's workers take one batch at a time"
        options = {k: value for k, value in study.options.items() if k != OPTION}
        return dataclasses.replace(study, options=options, notes=(*study.notes, note))

    def prepare(self, study: Study) -> Study:
        """Each family once per value of ``space.ray_ongoing_batches`` (labelled ``.../q1``, ``.../q2``)."""
        from servetune.ray import ONGOING_BATCHES as SERVER_DEFAULT

        if any(FAMILY_OPTION in f.options for f in study.families):
            return study  # already expanded
        if any(MODEL_CONFIG_KEY in f.model_config for f in study.families):
            return study  # set by hand
        values: tuple[int, ...] = tuple(study.options.get(OPTION, ())) or ONGOING_BATCHES

        def held(family: Family, n: int) -> Family:
            options = {**family.options, FAMILY_OPTION: n}
            return dataclasses.replace(family, label=f"{family.label}/q{n}", options=options)

        families = tuple(held(f, n) for f in study.families for n in values)

        def default(family: Family) -> Family:
            return held(family, SERVER_DEFAULT) if SERVER_DEFAULT in values else family

        models = tuple(dataclasses.replace(m, baseline_family=default(m.baseline_family)) for m in study.models)
        return dataclasses.replace(
            study, families=families, baseline_family=default(study.baseline_family), models=models
        )

    def embedded(self, study: Study, out_dir: Path, *, echo: bool = False) -> Target:
        return EmbeddedRayTarget(study, out_dir, self, echo=echo)

    def model_config(self, family: Family) -> dict[str, Any]:
        held = family.options.get(FAMILY_OPTION)
        return {} if held is None else {MODEL_CONFIG_KEY: held}

    def describe(self, family: Family) -> str:
        held = family.options.get(FAMILY_OPTION)
        return "" if held is None else f", replicas hold {held} batch{'es' if held > 1 else ''}"

    def describe_server(self, study: Study) -> str:
        return f"Ray Serve ({study.backend_address or 'a local Ray instance'})"

    def deploy(self, study: Study, config_properties: Path, command: str, *, packaged: bool) -> Deployed:
        address = f" --ray-address {study.backend_address}" if study.backend_address else ""
        command = command.replace("servetune serve ", f"servetune serve --backend ray{address} ", 1)
        if not packaged:
            return Deployed(command)
        path = write_ray_serve_config(config_properties, config_properties.with_name(RAY_SERVE_CONFIG))
        return Deployed(
            command,
            (f"on a running Ray cluster (no servetune driver): serve deploy {path.resolve()}",),
            {RAY_SERVE_CONFIG: path},
        )


def write_ray_serve_config(config_properties: Path, path: Path) -> Path:
    """The deployment of ``config_properties`` as a Ray Serve config, listening on every interface at Ray Serve's
    port (8000), with a proxy on every node: what ``serve deploy`` / KubeRay want on a cluster."""
    from servetune.config.server import ServerConfig
    from servetune.ray import export_serve_config

    config = ServerConfig.load(config_properties, cli={"inference_address": RAY_SERVE_ADDRESS}, environ={})
    return export_serve_config(config, (), path)


class EmbeddedRayTarget(EmbeddedTarget):
    """``servetune serve --backend ray`` (model API on, management token on) on the study's address, or on a
    private local Ray instance inside the server process (stopped with it). Families are registered from the same
    ``store/`` as on the native server; there is no metrics API: the bench reads the X-Servetune-* response headers.
    A local instance advertises enough CPUs for the widest config (Ray reserves ``numThreads`` CPUs per replica),
    so that every config the study names can be placed, oversubscribed as on the native server."""

    pinning = False

    def start(self) -> None:
        from servetune.embedded import EmbeddedServer

        properties = self.properties()
        address = self.study.backend_address or "local"
        threads = int(properties.get("threads_per_worker") or 1)
        cpus = max(max(f.workers) * int(f.model_config.get("numThreads") or threads) for f in self.study.families)
        num_cpus = max(os.cpu_count() or 1, cpus) if address == "local" else None
        server = EmbeddedServer(self.store, properties=properties, backend="ray", ray_address=address,
                                ray_num_cpus=num_cpus, echo=self.echo)  # fmt: skip
        self.attach(server.start())
