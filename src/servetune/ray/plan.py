"""What to deploy on Ray: each model version's :class:`~servetune.api.plan.VersionPlan` (the same plan the native
server serves) and the Ray Serve knobs around it.

A version's plan travels to its replicas in the application's args (Ray hashes them into the code version: a
change redeploys); what changes in place travels in ``user_config`` (batch size, delay, threads). The driver only
reads archives; each replica opens the archive again itself (``VersionPlan.archive``), so the path must be
visible on every node that runs a replica (a shared volume, or the image).

What the frontend and the replicas know of a model (its versions, which have replicas, its default) is one
:class:`ServedModel`, the driver's :class:`ModelPlan` reduced; every "which version does this request mean" on Ray,
in the driver, the frontend or a replica, is its :meth:`ServedModel.resolve`.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from servetune._exceptions import ApiError, ArchiveError, ConfigError
from servetune.api.plan import RegisterParams, VersionPlan, plan_version
from servetune.api.types import ModelRef
from servetune.archive import open_archive
from servetune.config.server import ServerConfig
from servetune.control import ControlSettings, parse_settings

FRONTEND_APP = "servetune"
ONGOING_BATCHES = 2  # batches' worth of requests a replica holds by default: one running, one forming
MAX_ONGOING_BATCHES = 64


@dataclass(frozen=True)
class RayVersion:
    """One model version on Ray: its plan as the replicas load it, and the knobs that change without a restart."""

    plan: VersionPlan
    min_workers: int
    max_workers: int
    batch_size: int  # live: ``@serve.batch`` max size and the handler's context (``user_config``)
    max_batch_delay_ms: int  # live: ``@serve.batch`` wait
    num_threads: int  # live: torch intra-op threads per replica (Ray reserves as many CPUs when it loads)
    ongoing_batches: int = ONGOING_BATCHES  # model-config ``rayOngoingBatches``
    control: ControlSettings | None = None  # the online controller's settings: one controller in each replica

    @property
    def batch_limit(self) -> int:
        """The largest batch a replica may form: the registered size, or the controller's upper bound when larger."""
        return max(self.batch_size, self.control.batch_size[1]) if self.control is not None else self.batch_size

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def version(self) -> str:
        return self.plan.version

    @property
    def autoscaling(self) -> bool:
        return self.max_workers > self.min_workers

    @property
    def serving(self) -> bool:
        """False when scaled to 0 workers: no deployment, requests answered 503."""
        return self.max_workers > 0

    @property
    def num_cpus(self) -> float:
        return float(self.plan.num_threads or 1)

    def scaled(self, min_workers: int, max_workers: int) -> RayVersion:
        return replace(self, min_workers=min_workers, max_workers=max(min_workers, max_workers))

    def user_config(self) -> dict[str, int]:
        return {
            "batch_size": self.batch_size,
            "max_batch_delay_ms": self.max_batch_delay_ms,
            "num_threads": self.num_threads,
        }


def ray_version(plan: VersionPlan) -> RayVersion:
    """The Ray knobs of a planned version; ApiError 400 for model-config keys Ray cannot honour."""
    if plan.cpu_pinning:
        raise ApiError.bad_request(
            f"model {plan.name}: cpuPinning is not supported on the Ray backend (Ray places replicas; give each "
            "replica its CPUs with numThreads instead)"
        )
    ongoing = plan.config.handler_config.get("rayOngoingBatches", ONGOING_BATCHES)
    if isinstance(ongoing, bool) or not isinstance(ongoing, int) or not 1 <= ongoing <= MAX_ONGOING_BATCHES:
        expected = f"expected an integer 1..{MAX_ONGOING_BATCHES}"
        raise ApiError.bad_request(f"{plan.url}: model-config.yaml: rayOngoingBatches={ongoing!r}: {expected}")
    if plan.name == FRONTEND_APP:
        raise ApiError.bad_request(f"model name {plan.name!r} is reserved by the Ray backend for its frontend")
    control = ray_control(plan)
    return RayVersion(
        plan=plan,
        min_workers=plan.min_workers,
        max_workers=plan.max_workers,
        batch_size=plan.batch_size,
        max_batch_delay_ms=plan.max_batch_delay_ms,
        num_threads=plan.num_threads or 1,
        ongoing_batches=ongoing,
        control=control,
    )


def ray_control(plan: VersionPlan) -> ControlSettings | None:
    """The version's ``controller:`` settings as a replica runs them; ApiError 400 naming the key for what is invalid
    and for what Ray does not let a replica move: its replicas (Ray's autoscaling moves them: ``minWorkers`` <
    ``maxWorkers``) and its threads (Ray reserves a replica's CPUs when it starts it)."""
    raw = plan.config.handler_config.get("controller")
    if raw is None:
        return None
    source = f"{plan.url}: model-config.yaml"
    try:
        settings = parse_settings(raw, source=source)
    except ConfigError as exc:
        raise ApiError.bad_request(str(exc)) from None
    why = {
        "controller.bounds.workers": settings.workers is not None and settings.workers != (1, 1),
        "controller.bounds.threads": settings.threads is not None,
        "controller.policy": settings.policy == "queue",
        "controller.static.workers": settings.static is not None and settings.static.workers != 1,
        "controller.phases": any(phase.knobs.workers != 1 for phase in settings.phases),
    }
    refused = next((key for key, bad in why.items() if bad), None)
    if refused is not None:
        raise ApiError.bad_request(
            f"{source}: {refused}: the Ray backend runs one controller in each replica, which moves that replica's "
            "batch size and delay and sheds; replicas are Ray's to scale (minWorkers < maxWorkers: Ray's "
            "autoscaling) and a replica's threads are fixed when Ray reserves its CPUs"
        )
    return settings


class Resolved(NamedTuple):
    """The version a request means, and whether it has replicas to answer it."""

    version: str
    deployed: bool


@dataclass(frozen=True)
class ServedModel:
    """A model as the frontend and its replicas see it: every registered version, those with a deployment (workers),
    and the default. Versions are independent, as TorchServe's: a default without workers answers 503 while another
    version with workers answers (through the frontend, which then holds the model's route). Shipped in each
    deployment's ``user_config`` and the frontend's (:meth:`to_json`)."""

    name: str
    default: str
    versions: tuple[str, ...]  # every registered version, sorted
    deployed: tuple[str, ...]  # the versions with a deployment, sorted

    def __post_init__(self) -> None:
        if self.default not in self.versions:
            raise ValueError(f"model {self.name}: default version {self.default!r} is not one of {self.versions}")
        if not set(self.deployed) <= set(self.versions):
            raise ValueError(f"model {self.name}: deployed versions {self.deployed} are not all in {self.versions}")

    @property
    def serving(self) -> bool:
        """Whether the default version has workers (its application holds the model's route)."""
        return self.default in self.deployed

    def resolve(self, version: str | None) -> Resolved:
        """The version meant (the default for None) and whether it is deployed; ApiError 404 for one not registered."""
        meant = self.default if version is None else version
        if meant not in self.versions:
            raise ApiError.version_not_found(self.name, meant)
        return Resolved(meant, meant in self.deployed)

    def refs(self) -> list[ModelRef]:
        return [ModelRef(self.name, v, "", v == self.default) for v in self.versions]

    def to_json(self) -> dict[str, Any]:
        versions, deployed = list(self.versions), list(self.deployed)
        return {"name": self.name, "default": self.default, "versions": versions, "deployed": deployed}

    @classmethod
    def from_json(cls, raw: Any) -> ServedModel:
        """Read :meth:`to_json`'s form; ValueError says what is wrong (a hand-edited Serve config)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("default"), str):
            raise ValueError(f"expected a served model {{name, default, versions, deployed}}, got {raw!r}")
        lists = [raw.get("versions"), raw.get("deployed", [])]
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
            raise ValueError(f"model {raw['name']}: versions and deployed must be lists of version strings")
        return cls(raw["name"], raw["default"], tuple(sorted(lists[0])), tuple(sorted(lists[1])))


@dataclass(frozen=True)
class ModelPlan:
    """A model name: one Ray Serve application at ``/predictions/<name>``, one deployment per version."""

    name: str
    versions: dict[str, RayVersion]
    default_version: str

    @property
    def serving(self) -> bool:
        return self.versions[self.default_version].serving

    @property
    def served(self) -> ServedModel:
        """What the frontend and the replicas are told of this model."""
        deployed = sorted(v for v, p in self.versions.items() if p.serving)
        return ServedModel(self.name, self.default_version, tuple(sorted(self.versions)), tuple(deployed))

    def get(self, version: str | None) -> RayVersion:
        """The version meant (the default for None); ApiError 404 for one not registered."""
        return self.versions[self.served.resolve(version).version]


def deployment_name(model: str, version: str) -> str:
    """Ray Serve deployment name of a model version, e.g. ``resnet18_v1_0``."""
    return f"{model}_v{re.sub(r'[^A-Za-z0-9_-]', '_', version)}"


def default_workers(config: ServerConfig) -> int:
    """Replicas for a start-up model that names none: ``default_workers_per_model``, else 1 (the driver's CPU count
    says nothing about the cluster's)."""
    return config.default_workers_per_model or 1


def read_plan(config: ServerConfig, archive_path: Path, params: RegisterParams) -> RayVersion:
    """Read one archive (extracted to a temporary directory and removed) and plan its version for Ray."""
    tmp = Path(tempfile.mkdtemp(prefix="servetune-plan-"))
    try:
        archive = open_archive(archive_path, tmp / "model")
        plan = plan_version(config, archive, archive_path.resolve(), params, default_workers(config))
    except ArchiveError as exc:
        raise ApiError.bad_archive(f"Failed to open model archive {params.url}: {exc}") from None
    except ConfigError as exc:
        raise ApiError.bad_request(str(exc)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ray_version(plan)


__all__ = [
    "FRONTEND_APP",
    "MAX_ONGOING_BATCHES",
    "ONGOING_BATCHES",
    "ModelPlan",
    "RayVersion",
    "Resolved",
    "ServedModel",
    "default_workers",
    "deployment_name",
    "ray_version",
    "read_plan",
]
