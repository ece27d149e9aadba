"""What to deploy on Ray: each model version's :class:`~servetune.api.plan.VersionPlan` (the same plan the native
server serves) and the Ray Serve knobs around it.

A version's plan travels to its replicas in the application's args (Ray hashes them into the code version: a
change redeploys); what changes in place travels in ``user_config`` (batch size, delay, threads). The driver only
reads archives; each replica opens the archive again itself (``VersionPlan.archive``), so the path must be
visible on every node that runs a replica (a shared volume, or the image).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from servetune._exceptions import ApiError, ArchiveError, ConfigError
from servetune.api.plan import RegisterParams, VersionPlan, plan_version
from servetune.archive import open_archive
from servetune.config.server import ServerConfig

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
    return RayVersion(
        plan=plan,
        min_workers=plan.min_workers,
        max_workers=plan.max_workers,
        batch_size=plan.batch_size,
        max_batch_delay_ms=plan.max_batch_delay_ms,
        num_threads=plan.num_threads or 1,
        ongoing_batches=ongoing,
    )


@dataclass(frozen=True)
class ModelPlan:
    """A model name: one Ray Serve application at ``/predictions/<name>``, one deployment per version."""

    name: str
    versions: dict[str, RayVersion]
    default_version: str

    @property
    def serving(self) -> bool:
        return self.versions[self.default_version].serving

    def get(self, version: str | None) -> RayVersion:
        if version is None:
            return self.versions[self.default_version]
        if version not in self.versions:
            raise ApiError.version_not_found(self.name, version)
        return self.versions[version]


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
    "default_workers",
    "deployment_name",
    "ray_version",
    "read_plan",
]
