"""servetune's own server as the trials' target: ``servetune serve`` started by the tuner (loopback, ephemeral
ports, model API on, token authorization on) with the study folder's ``store/`` as its model store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from servetune.tune.archives import ArchiveBuilder
from servetune.tune.management import ManagementClient
from servetune.tune.study import Family, Study
from servetune.tune.targets.base import Target, TargetKind, queue_size

if TYPE_CHECKING:
    from servetune.embedded import EmbeddedServer


class NativeKind(TargetKind):
    name = "native"
    label = "servetune"
    online_controller = True
    controller_knobs = ("batch_size", "max_batch_delay_ms", "workers", "threads")

    def embedded(self, study: Study, out_dir: Path, *, echo: bool = False) -> Target:
        return EmbeddedTarget(study, out_dir, self, echo=echo)


class EmbeddedTarget:
    """Starts ``servetune serve`` with the study folder's ``store/`` as model store; each family's archive folder
    is written there the first time a trial needs it, with the model-config keys its backend asks for."""

    can_register = True
    can_rebatch = True
    knobs_in_place = True
    pinning = True

    def __init__(self, study: Study, out_dir: Path, kind: TargetKind, *, echo: bool = False) -> None:
        self.study = study
        self.kind = kind
        self.echo = echo
        self.store = out_dir / "store"
        self.store.mkdir(parents=True, exist_ok=True)
        self.builder = ArchiveBuilder(self.store)
        self._urls: dict[str, str] = {}
        self.server: EmbeddedServer | None = None
        self.inference_url = ""
        self.grpc_url: str | None = None
        self.metrics_url: str | None = None  # servetune answers with timing headers: no /metrics scraping
        self.inference_headers: dict[str, str] = {}
        self.management = ManagementClient("http://127.0.0.1:1")

    def properties(self) -> dict[str, str]:
        """The server's config.properties: model API on, a queue deep enough for the widest config, the study's."""
        widest = max(queue_size(max(f.workers), max(f.batch_sizes)) for f in self.study.families)
        return {"enable_model_api": "true", "job_queue_size": str(widest), **self.study.server}

    def start(self) -> None:
        from servetune.embedded import EmbeddedServer

        self.attach(EmbeddedServer(self.store, properties=self.properties(), echo=self.echo).start())

    def attach(self, server: EmbeddedServer) -> None:
        self.server = server
        self.inference_url = server.inference_url
        grpc = server.urls.get("grpc_inference")
        self.grpc_url = None if grpc is None else "http://" + grpc.removeprefix("grpc://")
        self.inference_headers = server.auth_headers("inference")
        self.management = ManagementClient(server.management_url, server.auth_headers("management"))

    def archive_url(self, family: Family) -> str:
        if family.label not in self._urls:
            self._urls[family.label] = self.builder.family(family, self.kind.model_config(family))
        return self._urls[family.label]

    def server_pids(self) -> tuple[int, ...]:
        proc = self.server.proc if self.server is not None else None
        return (proc.pid,) if proc is not None else ()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
