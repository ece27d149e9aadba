"""``servetune serve``: TorchServe's ``torchserve --start`` flags, in the foreground."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from servetune.config.server import ServerConfig


@click.command("serve")
@click.option("--model-store", type=click.Path(file_okay=False, path_type=Path), help="Directory of model archives.")
@click.option(
    "--models",
    multiple=True,
    metavar="NAME=FILE.mar|FILE.mar|all",
    help="Models to load at start (repeatable, or space separated).",
)
@click.option(
    "--ts-config",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="TorchServe config.properties file.",
)
@click.option("--disable-token-auth", "--dt", is_flag=True, help="Turn off bearer-token authorization.")
@click.option("--enable-model-api", is_flag=True, help="Allow registering and deleting models through the API.")
@click.option("--foreground", is_flag=True, default=True, hidden=True, help="Accepted for TorchServe compatibility.")
@click.option("--no-config-snapshots", "--ncs", is_flag=True, hidden=True, help="Accepted; servetune takes none.")
@click.option(
    "--backend",
    type=click.Choice(["native", "ray"]),
    default="native",
    show_default=True,
    envvar="SERVETUNE_BACKEND",
    help="native: servetune's own frontend and workers. ray: a Ray Serve application per model (servetune[ray]).",
)
@click.option(
    "--ray-address",
    envvar="RAY_ADDRESS",
    metavar="ADDR",
    help="Ray cluster (host:port, auto, ray://..., or local: a new one in this process). Default: Ray's own rule "
    "(RAY_ADDRESS, else the cluster last started here, else a new local one). Only with --backend ray.",
)
@click.option(
    "--ray-serve-config",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="With --backend ray: write the Ray Serve config (serve deploy / KubeRay serveConfigV2) and exit.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the bound URLs and the start-up models' outcome here as JSON once the server is ready.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Frontend log level.",
)
def command(
    model_store: Path | None,
    models: tuple[str, ...],
    ts_config: Path | None,
    disable_token_auth: bool,
    enable_model_api: bool,
    foreground: bool,
    no_config_snapshots: bool,
    backend: str,
    ray_address: str | None,
    ray_serve_config: Path | None,
    ready_file: Path | None,
    log_level: str,
) -> None:
    """Serve models with TorchServe's HTTP APIs until SIGTERM or Ctrl-C.

    Settings: CLI flags > environment (TS_*, when enable_envvars_config=true) > --ts-config file > defaults.
    """
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s [%(levelname)s] %(name)s - %(message)s")
    from servetune.startup import CLOCK
    from servetune.startup import log as startup_log

    startup_log.debug(
        "start-up: interpreter %.0f ms, CLI imports %.0f ms",
        CLOCK.interpreter_ms,
        CLOCK.since_exec_ms() - CLOCK.interpreter_ms,
    )
    CLOCK.lap_ms()
    cli: dict[str, str] = {}
    if model_store is not None:
        cli["model_store"] = str(model_store)
    if disable_token_auth:
        cli["disable_token_authorization"] = "true"
    if enable_model_api:
        cli["enable_model_api"] = "true"
    config = ServerConfig.load(ts_config, cli=cli)
    if config.model_store is not None and not config.model_store.is_dir():
        raise click.BadParameter(f"{config.model_store} is not a directory", param_hint="--model-store")
    names = tuple(part for entry in models for part in entry.split())
    if backend == "ray":
        from servetune.ray import export_serve_config, require_ray, serve_on_ray

        if ray_serve_config is not None:  # writing the config needs no Ray
            click.echo(f"Wrote {export_serve_config(config, names, ray_serve_config)}")
            return
        require_ray()
        raise SystemExit(serve_on_ray(config, names, ray_address, ready_file))
    if ray_serve_config is not None:
        raise click.UsageError("--ray-serve-config needs --backend ray")
    from servetune.server import early

    early.start(config, names)  # start-up models' parents import torch while this process imports its stack
    from servetune.server import serve

    raise SystemExit(serve(config, names, ready_file))
