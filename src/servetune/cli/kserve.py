"""``servetune kserve``: the container entrypoint of servetune's KServe ServingRuntime (deploy/kserve/)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from servetune.config.kserve import MODEL_DIR, Ports, kserve_config


@click.command("kserve")
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=lambda: os.environ.get("MODEL_DIR", str(MODEL_DIR)),
    show_default="$MODEL_DIR or /mnt/models",
    help="KServe's model mount: config/config.properties and model-store/ (TorchServe's KServe layout).",
)
@click.option(
    "--http-port", type=int, default=Ports.http, show_default=True, help="REST: TorchServe, KServe v1, OIP v2."
)
@click.option("--grpc-port", type=int, default=Ports.grpc, show_default=True, help="gRPC (h2c): OIP v2, TorchServe.")
@click.option("--management-port", type=int, default=Ports.management, show_default=True, help="Loopback only.")
@click.option(
    "--grpc-management-port", type=int, default=Ports.grpc_management, show_default=True, help="Loopback only."
)
@click.option("--metrics-port", type=int, default=Ports.metrics, show_default=True, help="Prometheus /metrics.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), help="Write the URLs here once ready.")
def command(
    model_dir: Path,
    http_port: int,
    grpc_port: int,
    management_port: int,
    grpc_management_port: int,
    metrics_port: int,
    ready_file: Path | None,
) -> None:
    """Serve a KServe model mount on KServe's ports: every protocol at once (TorchServe REST and gRPC, KServe v1, the
    Open Inference Protocol v2 REST and gRPC), readiness on /v2/health/ready, the mount never written to."""
    logging.basicConfig(level=os.environ.get("KSERVE_LOGLEVEL", "INFO").upper())
    ports = Ports(http_port, grpc_port, management_port, grpc_management_port, metrics_port)
    config = kserve_config(model_dir, ports, os.environ)
    from servetune.server import serve

    raise SystemExit(serve(config, (), ready_file))
