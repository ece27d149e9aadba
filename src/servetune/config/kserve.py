"""The KServe model-server contract, for TorchServe's storage layout: where ``servetune kserve`` finds its models and
config, and which ports and settings KServe expects (docs/kserve.md).

KServe's storage initializer puts the model at ``/mnt/models`` (read-only), laid out as TorchServe's KServe image
wants it: ``config/config.properties`` (with ``model_snapshot`` or ``load_models``) and ``model-store/`` (``.mar``
files, or folders of an unpacked archive). KServe sends HTTP to port 8080 and gRPC (h2c) to 8081, scrapes metrics as
the runtime's annotations say (8082, ``/metrics``), and passes ``PROTOCOL_VERSION`` and the ISVC's
``serviceEnvelope`` label (``TS_SERVICE_ENVELOPE``). Nothing is ever written into the model directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servetune.config.properties import read_properties
from servetune.config.server import ServerConfig

MODEL_DIR = Path("/mnt/models")
ENVELOPES = {"v1": "kserve", "grpc-v1": "kserve", "v2": "kservev2", "grpc-v2": "kservev2"}


@dataclass(frozen=True)
class Ports:
    http: int = 8080  # inference: TorchServe REST, KServe v1, OIP v2 REST
    grpc: int = 8081  # h2c: OIP v2 gRPC and TorchServe's inference gRPC
    management: int = 8085  # loopback only: KServe exposes the two above
    grpc_management: int = 7071  # loopback only
    metrics: int = 8082  # the runtime's prometheus.kserve.io/port
    host: str = "0.0.0.0"  # where the HTTP, gRPC inference and metrics ports listen (KServe's server: everywhere)


def kserve_config(model_dir: Path, ports: Ports, environ: Mapping[str, str], workdir: Path) -> ServerConfig:
    """The server config for a KServe pod: the layout's config.properties (if any) with KServe's ports and the model
    store under ``model_dir``; every start-up model in the store when the file names none. ``workdir``: a private
    directory for the token keys (the model directory is read-only; the caller removes it)."""
    config_file = model_dir / "config" / "config.properties"
    store = model_dir / "model-store" if (model_dir / "model-store").is_dir() else model_dir
    raw = dict(read_properties(config_file)) if config_file.is_file() else {}
    overrides = {
        "model_store": str(store),
        "inference_address": f"http://{_url_host(ports.host)}:{ports.http}",
        "grpc_inference_address": ports.host,
        "grpc_inference_port": str(ports.grpc),
        "management_address": f"http://127.0.0.1:{ports.management}",
        "grpc_management_address": "127.0.0.1",
        "grpc_management_port": str(ports.grpc_management),
        "metrics_address": f"http://{_url_host(ports.host)}:{ports.metrics}",
        "enable_metrics_api": "true",
        # the keys go to a private directory: the model directory is read-only, the working directory may be too
        "key_file": str(workdir / "key_file.json"),
    }
    if "load_models" not in raw and "model_snapshot" not in raw:
        overrides["load_models"] = "all"
    envelope = environ.get("TS_SERVICE_ENVELOPE") or ENVELOPES.get(environ.get("PROTOCOL_VERSION", ""), "")
    if envelope:
        overrides["service_envelope"] = envelope
    return ServerConfig.load(config_file if config_file.is_file() else None, cli=overrides, environ=environ)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host  # an IPv6 address in a URL


__all__ = ["ENVELOPES", "MODEL_DIR", "Ports", "kserve_config"]
