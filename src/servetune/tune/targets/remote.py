"""A server already running (``servetune tune --url``): the tuner only changes what its management API lets it
change, and puts the model back as it found it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from servetune._exceptions import ConfigError, ServetuneError
from servetune.tune import targets
from servetune.tune.management import ManagementClient, ManagementError
from servetune.tune.study import Config, Family, Study


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
        self.grpc_url: str | None = None  # --url tunes over HTTP
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
        self.knobs_in_place = False
        self.pinning = True  # a server that cannot pin refuses it (400): an error trial

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
        self.knobs_in_place = "numThreads" in described  # servetune's describe; TorchServe's has no thread knobs

    def adapt(self, study: Study) -> tuple[Study, list[str]]:
        """The study reduced to what this server lets the tuner change."""
        described = self.original
        notes = ["--url: optimization and device stay as the server has them"]
        for kind in targets.kinds():
            dropped = kind.drop(study, "--url")
            notes += dropped.notes[len(study.notes) :]
            study = dataclasses.replace(dropped, notes=study.notes)
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
        adapted = dataclasses.replace(study, families=(family,), baseline_family=family, default_config=default)
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

    def server_pids(self) -> tuple[int, ...]:
        return ()  # a running server: the bench finds the process listening on its port, when it is on this machine

    def close(self) -> None:
        self.restore()
