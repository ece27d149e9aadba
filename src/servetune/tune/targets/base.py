"""The server trials run on: an embedded ``servetune serve`` the tuner starts (``--backend native`` or ``ray``), or a
server already running (``--url``), which only lets the tuner change what its management API can change."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from servetune._exceptions import ConfigError, ServetuneError
from servetune.tune.archives import ArchiveBuilder
from servetune.tune.management import ManagementClient, ManagementError
from servetune.tune.study import Config, Family, Study

if TYPE_CHECKING:
    from servetune.embedded import EmbeddedServer


class Target(Protocol):
    inference_url: str
    metrics_url: str | None
    inference_headers: dict[str, str]
    management: ManagementClient
    can_register: bool  # a model can be registered (another family, or batching where rebatch is not supported)
    can_rebatch: bool  # batch size and delay change in place (servetune's PUT /models/{name}?batch_size=)

    def start(self) -> None: ...

    def archive_url(self, family: Family) -> str: ...

    def close(self) -> None: ...


def queue_size(workers: int, batch_size: int) -> int:
    """A job queue deep enough that a full round of batches never bounces off it."""
    return max(100, 4 * workers * batch_size)


class EmbeddedTarget:
    """Starts ``servetune serve`` (model API on, token auth on) with the study folder's ``store/`` as model store;
    each family's archive folder is written there the first time a trial needs it."""

    can_register = True
    can_rebatch = True

    def __init__(self, study: Study, out_dir: Path, *, echo: bool = False) -> None:
        self.study = study
        self.echo = echo
        self.store = out_dir / "store"
        self.store.mkdir(parents=True, exist_ok=True)
        self.builder = ArchiveBuilder(self.store)
        self._urls: dict[str, str] = {}
        self.server: EmbeddedServer | None = None
        self.inference_url = ""
        self.metrics_url: str | None = None
        self.inference_headers: dict[str, str] = {}
        self.management = ManagementClient("http://127.0.0.1:1")

    def properties(self) -> dict[str, str]:
        """The server's config.properties: model API on, a queue deep enough for the widest config, the study's."""
        widest = max(queue_size(max(f.workers), max(f.batch_sizes)) for f in self.study.families)
        return {"enable_model_api": "true", "job_queue_size": str(widest), **self.study.server}

    def start(self) -> None:
        from servetune.embedded import EmbeddedServer

        self.server = EmbeddedServer(self.store, properties=self.properties(), echo=self.echo).start()
        self.inference_url = self.server.inference_url
        self.inference_headers = self.server.auth_headers("inference")
        self.management = ManagementClient(self.server.management_url, self.server.auth_headers("management"))

    def archive_url(self, family: Family) -> str:
        if family.label not in self._urls:
            self._urls[family.label] = self.builder.family(family)
        return self._urls[family.label]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


class EmbeddedRayTarget(EmbeddedTarget):
    """``servetune serve --backend ray`` (model API on, management token on) on the study's ``ray_address``, or on a
    private local Ray instance inside the server process (stopped with it). Families are registered from the same
    ``store/`` as on the native server; there is no metrics API: the bench reads the X-Servetune-* response headers.
    A local instance advertises enough CPUs for the widest config (Ray reserves ``numThreads`` CPUs per replica),
    so that every config the study names can be placed, oversubscribed as on the native server."""

    def start(self) -> None:
        from servetune.embedded import EmbeddedServer

        properties = self.properties()
        address = self.study.ray_address or "local"
        threads = int(properties.get("threads_per_worker") or 1)
        cpus = max(max(f.workers) * int(f.model_config.get("numThreads") or threads) for f in self.study.families)
        num_cpus = max(os.cpu_count() or 1, cpus) if address == "local" else None
        server = EmbeddedServer(self.store, properties=properties, backend="ray", ray_address=address,
                                ray_num_cpus=num_cpus, echo=self.echo)  # fmt: skip
        self.server = server.start()
        self.inference_url = server.inference_url
        self.metrics_url = None
        self.inference_headers = server.auth_headers("inference")
        self.management = ManagementClient(server.management_url, server.auth_headers("management"))


def embedded_target(study: Study, out_dir: Path, *, echo: bool = False) -> EmbeddedTarget:
    """The embedded server of the study's backend."""
    target = EmbeddedRayTarget if study.backend == "ray" else EmbeddedTarget
    return target(study, out_dir, echo=echo)


class RemoteTarget:
    """A running server. Scaling workers always works; batch size and delay change in place on a servetune server,
    and otherwise need its model API (re-registering the model from its own URL); optimization and device cannot
    change. Its settings are put back at the end."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        management_url: str | None = None,
        metrics_url: str | None = None,
        key_file: Path | None = None,
    ) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--url={url!r}: expected the inference address, http://HOST:PORT")
        self.inference_url = url.rstrip("/")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        default_management = f"{parts.scheme}://{parts.hostname}:{port + 1}"
        # servetune answers with per-request timing headers; TorchServe needs its metrics API for the breakdown
        self.metrics_url = metrics_url
        headers: dict[str, dict[str, str]] = {"management": {}, "inference": {}}
        if key_file is not None:
            try:
                keys = json.loads(key_file.read_text())
                headers = {kind: {"Authorization": f"Bearer {keys[kind]['key']}"} for kind in headers}
            except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
                raise ConfigError(f"--key-file={str(key_file)!r}: not a TorchServe key file ({exc})") from None
        self.inference_headers = headers["inference"]
        self.management = ManagementClient(management_url or default_management, headers["management"])
        self.model = model
        self.original: dict[str, object] = {}
        self.can_register = False
        self.can_rebatch = False

    def start(self) -> None:
        if self.original:
            return
        try:
            described = self.management.describe(self.model)
        except ManagementError as exc:
            raise ServetuneError(f"--url: model {self.model!r} is not served there: {exc}") from None
        self.original = described
        self.can_register = self.management.model_api_enabled()
        self.can_rebatch = self.management.rebatch_supported(self.model, described)

    def adapt(self, study: Study) -> tuple[Study, list[str]]:
        """The study reduced to what this server lets the tuner change."""
        described = self.original
        notes = ["--url: optimization and device stay as the server has them"]
        if study.ray_ongoing_batches:
            notes.append("--url: space.ray_ongoing_batches ignored: a replica holds what the server was deployed with")
        family = dataclasses.replace(
            study.families[0], label="served", optimization="as served", device=str(described.get("deviceType", "cpu"))
        )
        default = None
        if not self.can_register and self.can_rebatch:
            notes.append("--url: the server's model API is off: batch size and delay change in place")
        elif not self.can_register:
            notes.append("--url: the server's model API is off: only the number of workers is tuned")
            batch, delay = int(str(described.get("batchSize", 1))), int(str(described.get("maxBatchDelay", 100)))
            family = dataclasses.replace(family, batch_sizes=(batch,), batch_delays_ms=(delay,))
            default = Config("served", 1, batch, delay)
        adapted = dataclasses.replace(
            study, families=(family,), baseline_family=family, default_config=default, ray_ongoing_batches=()
        )
        return adapted, notes

    def archive_url(self, family: Family) -> str:
        return str(self.original.get("modelUrl", ""))

    def restore(self) -> None:
        """Put the model back as it was found."""
        described = self.management.describe(self.model)
        batch, delay = self.original.get("batchSize"), self.original.get("maxBatchDelay")
        found = self.original.get("workers")
        workers = (len(found) if isinstance(found, list) else 0) or int(str(self.original.get("minWorkers", 1)))
        if self.can_rebatch:
            self.management.rebatch(
                self.model, batch_size=int(str(batch)), max_batch_delay=int(str(delay)), workers=workers
            )
        elif (described.get("batchSize"), described.get("maxBatchDelay")) != (batch, delay) and self.can_register:
            self.management.unregister(self.model)
            self.management.register(
                str(self.original["modelUrl"]), self.model, batch_size=int(str(batch)),
                max_batch_delay=int(str(delay)), workers=workers,
            )  # fmt: skip
        else:
            self.management.scale(self.model, workers)

    def close(self) -> None:
        self.restore()
