"""The servers trials run on, behind one registry: backend name -> ``"module:attr"`` of a :class:`TargetKind`.

A kind owns everything about its backend: the study keys it reads (``ray_address``, ``space.ray_ongoing_batches``),
its checks, how it expands the space (``prepare``), the server it starts for the trials, the model-config keys its
archives need, and the extra deploy files it writes. The rest of the tuner only names ``study.backend``.

A *target* (``base.Target``) is one running server: the embedded one a kind starts, or a running server given with
``--url`` (``remote.RemoteTarget``).
"""

from __future__ import annotations

from functools import cache

from servetune._exceptions import ConfigError
from servetune.registry import registered
from servetune.tune.study import Study
from servetune.tune.targets.base import Target, TargetKind

TARGETS: dict[str, str] = {
    "native": "servetune.tune.targets.native:NativeKind",
    "ray": "servetune.tune.targets.ray:RayKind",
}


@cache
def target_kind(name: str) -> TargetKind:
    kind: TargetKind = registered(TARGETS, name, f"backend={name!r}: expected {' or '.join(TARGETS)}")()
    return kind


def kinds() -> list[TargetKind]:
    return [target_kind(name) for name in TARGETS]


def placement_keys() -> tuple[str, ...]:
    """Top-level study keys that say which backend and where: ``backend`` and every kind's address key."""
    return ("backend", *(k.address_key for k in kinds() if k.address_key))


def space_keys() -> tuple[str, ...]:
    return tuple(key for kind in kinds() for key in kind.space_keys)


def kind_of_address(key: str) -> TargetKind:
    return next(k for k in kinds() if k.address_key == key)


def check(study: Study) -> None:
    """The backend is known; an address is that backend's and well formed; the backend's own checks."""
    kind = target_kind(study.backend)
    if study.backend_address is not None:
        owners = [k for k in kinds() if k.address_key]
        owner = kind if kind.address_key else owners[0]
        owner.check_address(study.backend_address)
        if owner is not kind:
            raise ConfigError(
                f"{owner.address_key}={study.backend_address!r}: only used with backend {owner.name} "
                f"(backend is {study.backend})"
            )
    kind.check(study)


def prepare(study: Study) -> Study:
    """The study as its backend searches it; settings of the other backends are dropped with a note."""
    kind = target_kind(study.backend)
    for other in kinds():
        if other is not kind:
            study = other.drop(study, kind.name)
    return kind.prepare(study)


__all__ = ["TARGETS", "Target", "TargetKind", "check", "kinds", "prepare", "target_kind"]
