"""A model's controller settings: the ``controller:`` section of its model-config.yaml (or of its ``models=`` entry in
config.properties), validated once, at registration, with errors that name the key, the value and what was expected.

```yaml
controller:
  policy: controller            # controller (servetune's) | static | greedy | aimd | lsq | queue | oracle
  slo: {p99_ms: 100}            # exactly one of p99_ms, p95_ms, mean_ms
  bounds:                       # [low, high] for each knob the policy may move
    batch_size: [1, 32]
    max_batch_delay_ms: [0, 50]
    workers: [1, 4]
  shed: true                    # answer 503 + Retry-After at once to a request predicted to miss its deadline
  probe: "{}"                   # optional: a request body run once at registration to check the SLA is reachable
  log: /var/log/servetune/decisions.jsonl   # optional: the decision log (JSONL, rotated at log_max_mb)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servetune._exceptions import ConfigError
from servetune.config.model import LIMIT, shown

POLICY_NAMES = ("controller", "static", "greedy", "aimd", "lsq", "queue", "oracle")
TARGETS = ("p99_ms", "p95_ms", "mean_ms")
_TOP_KEYS = {
    "policy",
    "slo",
    "bounds",
    "shed",
    "probe",
    "log",
    "log_max_mb",
    "static",
    "phases",
    "aimd",
    "queue",
    "tick_ms",
}
_KNOBS = ("batch_size", "max_batch_delay_ms", "workers", "threads")
_KNOB_MIN = {"batch_size": 1, "max_batch_delay_ms": 0, "workers": 1, "threads": 1}


@dataclass(frozen=True)
class Knobs:
    """The knobs a policy moves: batch size, batch delay, workers, and intra-op threads per worker (0: as they are;
    only servetune's policy moves them, and only with ``bounds.threads``)."""

    batch_size: int
    max_batch_delay_ms: float
    workers: int
    threads: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "max_batch_delay_ms": round(self.max_batch_delay_ms, 3),
            "workers": self.workers,
            **({"threads": self.threads} if self.threads else {}),
        }


@dataclass(frozen=True)
class Phase:
    """The oracle's config until ``until_s`` seconds after the controller started."""

    until_s: float
    knobs: Knobs


@dataclass(frozen=True)
class ControlSettings:
    """One model's controller settings (see the module)."""

    target: str  # "p99_ms", "p95_ms" or "mean_ms"
    target_ms: float
    policy: str = "controller"
    batch_size: tuple[int, int] = (1, 32)
    max_batch_delay_ms: tuple[int, int] = (0, 100)
    workers: tuple[int, int] | None = None  # None: the policy leaves workers as registered
    threads: tuple[int, int] | None = None  # None: threads per worker stay the model's own
    shed: bool = False
    probe: str | None = None
    log: str | None = None
    log_max_bytes: int = 10 * 2**20
    tick_s: float = 0.1  # how often the policy reconsiders the knobs
    static: Knobs | None = None  # the static policy's knobs (None: the model's registered ones)
    phases: tuple[Phase, ...] = ()  # the oracle's
    params: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # a baseline's own (aimd, queue)

    @property
    def key(self) -> str:
        """The SLA's key as a message names it."""
        return f"controller.slo.{self.target}"

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "slo": {self.target: self.target_ms},
            "bounds": {
                "batch_size": list(self.batch_size),
                "max_batch_delay_ms": list(self.max_batch_delay_ms),
                **({"workers": list(self.workers)} if self.workers else {}),
                **({"threads": list(self.threads)} if self.threads else {}),
            },
            "shed": self.shed,
        }


PROBES = 3  # ``controller.probe`` runs this many times at registration; its fastest is the batch-1 time


def unreachable(settings: ControlSettings, batch1_ms: float, where: str) -> str | None:
    """The registration's refusal when the fastest of the PROBES runs of ``controller.probe`` (``where`` it ran)
    took longer than the SLA allows; None when the SLA is reachable."""
    if batch1_ms <= settings.target_ms:
        return None
    return (
        f"{settings.key}={settings.target_ms:g} is below the model's batch-1 time: {batch1_ms:.1f} ms, the fastest "
        f"of {PROBES} runs of controller.probe {where}"
    )


def _number(value: Any, key: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{key} must be a number between {low:g} and {high:g}, got {shown(repr(value))}")
    return float(value)


def _integer(value: Any, key: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key} must be an integer between {low} and {high}, got {shown(repr(value))}")
    return value


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping, got {shown(repr(value))}")
    return value


def _unknown(raw: Mapping[str, Any], known: set[str] | tuple[str, ...], prefix: str) -> None:
    extra = sorted(str(k) for k in raw if k not in known)
    if extra:
        raise ConfigError(f"{prefix}.{extra[0]}: unknown key (expected one of {', '.join(sorted(known))})")


def _bound(value: Any, key: str, low: int, high: int) -> tuple[int, int]:
    if not (isinstance(value, list | tuple) and len(value) == 2):
        raise ConfigError(f"{key} must be [low, high], got {shown(repr(value))}")
    lo = _integer(value[0], key, low, high)
    hi = _integer(value[1], key, low, high)
    if hi < lo:
        raise ConfigError(f"{key} must be [low, high] with low <= high, got {list(value)}")
    return lo, hi


def _knobs(raw: Any, key: str, max_workers: int) -> Knobs:
    values = _mapping(raw, key)
    _unknown(values, ("batch_size", "max_batch_delay_ms", "workers"), key)
    return Knobs(
        _integer(values.get("batch_size", 1), f"{key}.batch_size", 1, LIMIT),
        _number(values.get("max_batch_delay_ms", 0), f"{key}.max_batch_delay_ms", 0, LIMIT),
        _integer(values.get("workers", 1), f"{key}.workers", 1, max_workers),
    )


def parse_settings(raw: Any, *, source: str = "controller", max_workers: int = LIMIT) -> ControlSettings:
    """Validate a ``controller:`` section; ConfigError naming the key (``controller.bounds.batch_size``) otherwise.
    ``max_workers``: the server's ``max_workers_per_model``, the largest worker bound."""
    try:
        return _parse(raw, max_workers)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse(raw: Any, max_workers: int) -> ControlSettings:
    section = _mapping(raw, "controller")
    _unknown(section, _TOP_KEYS, "controller")
    policy = section.get("policy", "controller")
    if policy not in POLICY_NAMES:
        raise ConfigError(f"controller.policy must be one of {', '.join(POLICY_NAMES)}, got {shown(repr(policy))}")
    slo = _mapping(section.get("slo"), "controller.slo") if "slo" in section else {}
    _unknown(slo, TARGETS, "controller.slo")
    given = [t for t in TARGETS if t in slo]
    if len(given) != 1:
        raise ConfigError(f"controller.slo must give exactly one of {', '.join(TARGETS)}, got {dict(slo)}")
    target = given[0]
    target_ms = _number(slo[target], f"controller.slo.{target}", 0.001, 3_600_000)
    bounds = _mapping(section.get("bounds", {}), "controller.bounds")
    _unknown(bounds, _KNOBS, "controller.bounds")
    limits = {"batch_size": LIMIT, "max_batch_delay_ms": LIMIT, "workers": max_workers, "threads": LIMIT}
    parsed = {
        knob: _bound(bounds[knob], f"controller.bounds.{knob}", _KNOB_MIN[knob], limits[knob])
        for knob in _KNOBS
        if knob in bounds
    }
    shed = section.get("shed", False)
    if not isinstance(shed, bool):
        raise ConfigError(f"controller.shed must be true or false, got {shown(repr(shed))}")
    probe = section.get("probe")
    if probe is not None and not isinstance(probe, str):
        raise ConfigError(f"controller.probe must be a string (a request body), got {shown(repr(probe))}")
    log = section.get("log")
    if log is not None and not (isinstance(log, str) and log):
        raise ConfigError(f"controller.log must be a file path, got {shown(repr(log))}")
    log_mb = _number(section.get("log_max_mb", 10), "controller.log_max_mb", 0.01, 100_000)
    tick_ms = _number(section.get("tick_ms", 100), "controller.tick_ms", 10, 10_000)
    static = _knobs(section["static"], "controller.static", max_workers) if "static" in section else None
    phases: list[Phase] = []
    if "phases" in section:
        items = section["phases"]
        if not isinstance(items, list) or not items:
            raise ConfigError(f"controller.phases must be a non-empty list, got {shown(repr(items))}")
        for i, item in enumerate(items):
            key = f"controller.phases[{i}]"
            entry = dict(_mapping(item, key))
            until = _number(entry.pop("until_s", 1e12), f"{key}.until_s", 0, 1e12)
            phases.append(Phase(until, _knobs(entry, key, max_workers)))
    if policy == "oracle" and not phases:
        raise ConfigError("controller.phases must be given for policy oracle (its config for each phase)")
    params: dict[str, dict[str, float]] = {}
    for name, keys in (("aimd", ("step", "backoff")), ("queue", ("target_ongoing", "upscale_s", "downscale_s"))):
        if name in section:
            values = _mapping(section[name], f"controller.{name}")
            _unknown(values, keys, f"controller.{name}")
            params[name] = {k: _number(v, f"controller.{name}.{k}", 0, 1e9) for k, v in values.items()}
    return ControlSettings(
        target=target,
        target_ms=target_ms,
        policy=policy,
        batch_size=parsed.get("batch_size", (1, 32)),
        max_batch_delay_ms=parsed.get("max_batch_delay_ms", (0, 100)),
        workers=parsed.get("workers"),
        threads=parsed.get("threads"),
        shed=shed,
        probe=probe,
        log=log,
        log_max_bytes=int(log_mb * 2**20),
        tick_s=tick_ms / 1000.0,
        static=static,
        phases=tuple(phases),
        params=params,
    )


__all__ = ["POLICY_NAMES", "PROBES", "TARGETS", "ControlSettings", "Knobs", "Phase", "parse_settings", "unreachable"]
