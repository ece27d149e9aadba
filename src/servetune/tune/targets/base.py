"""The two contracts of ``targets/``: a :class:`Target` is one running server the trials drive through its
management API; a :class:`TargetKind` is a backend the tuner can start one on, with what it reads from the study."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from servetune.tune.management import ManagementClient
from servetune.tune.study import Family, Study


class Target(Protocol):
    inference_url: str
    grpc_url: str | None  # the gRPC inference port as http://HOST:PORT, when the server has one
    metrics_url: str | None
    inference_headers: dict[str, str]
    management: ManagementClient
    can_register: bool  # a model can be registered (another family, or batching where rebatch is not supported)
    can_rebatch: bool  # batch size and delay change in place (servetune's PUT /models/{name}?batch_size=)
    knobs_in_place: bool  # threads and pinning change in place (the server echoes ``numThreads`` in describe)
    pinning: bool  # workers can be pinned to cores of their own (``cpuPinning``)

    def start(self) -> None: ...

    def archive_url(self, family: Family) -> str: ...

    def server_pids(self) -> tuple[int, ...]:
        """The server's processes on this machine (their children included): their CPU is the server's, not
        interference. () when unknown (the bench then looks for the process listening on the URL's port)."""
        ...

    def close(self) -> None: ...


def queue_size(workers: int, batch_size: int) -> int:
    """A job queue deep enough that a full round of batches never bounces off it."""
    return max(100, 4 * workers * batch_size)


class TargetKind:
    """A backend: the defaults here are a backend with no settings of its own."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""  # for people: "Ray Serve"
    address_key: ClassVar[str | None] = None  # the study key (and --NAME option) saying where it runs
    address_hint: ClassVar[str] = ""  # what that address looks like, for error messages
    space_keys: ClassVar[tuple[str, ...]] = ()  # ``space`` keys it reads (accepted whatever the backend)
    online_controller: ClassVar[bool] = False  # the tuner compares the online controller on it (docs/controller.md)
    # the knobs a model-config.yaml ``controller:`` moves on it (its bounds in the deploy output); (): it runs none
    controller_knobs: ClassVar[tuple[str, ...]] = ()

    def read(self, space: Mapping[str, Any], model_config: Mapping[str, Any]) -> dict[str, Any]:
        """Its ``space`` keys, type-checked, as study options (empty when none is given)."""
        return {}

    def check_address(self, address: str) -> None:
        """Raise ConfigError when ``address`` is not one of this backend's."""

    def check(self, study: Study) -> None:
        """Raise ConfigError, before any trial, for a study this backend cannot run."""

    def drop(self, study: Study, where: str) -> Study:
        """The study without this backend's options, with a note, when it runs elsewhere (``where``: the backend
        it runs on, or ``--url``)."""
        return study

    def prepare(self, study: Study) -> Study:
        """The study as this backend searches it (a backend may add knobs as families)."""
        return study

    def embedded(self, study: Study, out_dir: Path, *, echo: bool = False) -> Target:
        """The server this backend starts for the trials (``Target.start`` starts it)."""
        raise NotImplementedError

    def model_config(self, family: Family) -> dict[str, Any]:
        """model-config.yaml keys this backend needs in the family's archives (trials and deploy)."""
        return {}

    def describe(self, family: Family) -> str:
        """What this backend adds to a family's description (e.g. ", replicas hold 2 batches")."""
        return ""

    def describe_server(self, study: Study) -> str:
        """The server trials ran on, for the report ("" for the default)."""
        return ""

    def deploy(self, study: Study, config_properties: Path, command: str, *, packaged: bool) -> Deployed:
        """The serve command for the winner on this backend, and any extra deploy files (``packaged``: the archive
        was written into the deploy folder)."""
        return Deployed(command)


class Deployed:
    """What a backend adds to the deploy folder: the serve command, other ways to serve it, extra files."""

    def __init__(self, command: str, alternatives: tuple[str, ...] = (), files: Mapping[str, Path] | None = None):
        self.command = command
        self.alternatives = alternatives
        self.files = dict(files or {})
