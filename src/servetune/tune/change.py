"""What it takes to move a served model from one config to another: a pure plan, then a small executor.

The target's capabilities are known before the first trial (:class:`Capabilities`: servetune's own servers say them,
a running server is probed once); :func:`plan_change` turns (the config a model is in, the config wanted, those
capabilities) into management API steps, cheapest first:

- only the workers differ -> :class:`Scale` (works under load, no restart);
- batch size or delay differ -> changed in place (:class:`Update`, servetune's ``PUT /models/{name}?batch_size=``)
  where the server can, else the model is registered again;
- intra-op threads, inter-op threads or pinning differ -> in place too (:class:`Update`; inter-op threads restart
  the workers server-side), where the server echoes them in describe; a server that does not gets them written into
  a copy of the family's archive (:func:`archive_of`), one archive per setting, registered afresh;
- the family differs -> :class:`Unregister` and :class:`Register`.

:func:`apply_step` runs a step through a :class:`~servetune.tune.management.ManagementClient` and checks that a batching
change was taken: a server that answered but kept its old batching is an error, never a measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servetune._exceptions import ConfigError
from servetune.tune.management import ManagementClient, ManagementError
from servetune.tune.study import Config

# Config field -> (management API parameter, describe key, model-config.yaml key)
THREAD_KNOBS = {
    "threads": ("num_threads", "numThreads", "numThreads"),
    "inter_op_threads": ("inter_op_threads", "interOpThreads", "interOpThreads"),
    "pinning": ("cpu_pinning", "cpuPinning", "cpuPinning"),
}


@dataclass(frozen=True)
class Capabilities:
    """What a target's management API can change."""

    can_register: bool = True  # register/unregister a model (another family; batching where not in place)
    can_rebatch: bool = True  # batch size and delay change in place
    knobs_in_place: bool = True  # threads and pinning change in place (the server echoes them in describe)
    pinning: bool = True  # workers can be pinned to cores of their own (Ray places replicas itself)


NATIVE = Capabilities()  # servetune's own server
RAY = Capabilities(pinning=False)  # servetune on Ray Serve
TORCHSERVE = Capabilities(can_rebatch=False, knobs_in_place=False)  # TorchServe with its model API on


@dataclass(frozen=True)
class Served:
    """What a model is served from now: the archive (see :func:`archive_of`) and the config it is in."""

    archive: str
    config: Config


@dataclass(frozen=True)
class Unregister:
    pass


@dataclass(frozen=True)
class Register:
    archive: str
    config: Config
    workers: int  # 0 when the knobs are set by the Update that follows, before any worker starts


@dataclass(frozen=True)
class Scale:
    workers: int


@dataclass(frozen=True)
class Update:
    """One ``PUT /models/{name}`` with servetune's parameters, scaling to ``workers`` in the same call."""

    workers: int
    params: tuple[tuple[str, Any], ...]

    @property
    def rebatches(self) -> bool:
        return any(key == "batch_size" for key, _ in self.params)


Step = Unregister | Register | Scale | Update


def knobs_of(config: Config) -> dict[str, int | bool]:
    return {field: getattr(config, field) for field in THREAD_KNOBS}


def default_knobs(config: Config) -> bool:
    return not any(knobs_of(config).values())


def without_knobs(config: Config) -> Config:
    return dataclasses.replace(config, threads=0, inter_op_threads=0, pinning=False)


def archive_of(config: Config, capabilities: Capabilities) -> str:
    """The archive that serves ``config``: its family's, or, where threads and pinning cannot change in place, the
    family's copy with them written into its model-config.yaml (``family|threads=2``)."""
    if capabilities.knobs_in_place or default_knobs(config):
        return config.family
    return config.family + "".join(f"|{k}={v}" for k, v in knobs_of(config).items() if v)


def knob_params(old: Config, new: Config) -> tuple[tuple[str, Any], ...]:
    """The management API parameters for the thread knobs that differ (booleans as ``true``/``false``)."""
    params: list[tuple[str, Any]] = []
    for field, (param, _, _) in THREAD_KNOBS.items():
        value = getattr(new, field)
        if value != getattr(old, field):
            params.append((param, str(value).lower() if isinstance(value, bool) else value))
    return tuple(params)


def plan_change(
    current: Served | None, wanted: Config, capabilities: Capabilities, *, registered: bool = False
) -> tuple[Step, ...]:
    """The steps from ``current`` (None: not served by this tuner; ``registered``: the model is there anyway, in a
    config nobody knows) to ``wanted``. Pure: no call is made. Raises ConfigError for a config the target cannot
    take at all."""
    if wanted.pinning and not capabilities.pinning:
        raise ConfigError(f"{wanted.key}: this server cannot pin workers to cores (cpuPinning)")
    archive = archive_of(wanted, capabilities)
    if current is not None and current.config == wanted and current.archive == archive:
        return ()
    if current is not None and current.archive == archive:
        old = current.config
        params: list[tuple[str, Any]] = []
        if (old.batch_size, old.batch_delay_ms) != (wanted.batch_size, wanted.batch_delay_ms):
            if not capabilities.can_rebatch:
                return _register(wanted, archive, capabilities, unregister=True)
            params += [("batch_size", wanted.batch_size), ("max_batch_delay", wanted.batch_delay_ms)]
        knobs = knob_params(old, wanted)  # same archive: they change in place
        steps: list[Step] = []
        if knobs and wanted.workers < old.workers:
            steps.append(Scale(wanted.workers))  # fewer workers first: pinned core sets must fit them
        if params or knobs:
            steps.append(Update(wanted.workers, (*params, *knobs)))
        elif old.workers != wanted.workers:
            steps.append(Scale(wanted.workers))
        return tuple(steps)
    if not capabilities.can_register:
        if current is None and capabilities.can_rebatch:
            # A running server whose model API is off: batching changes in place, the family is what it serves.
            params = [("batch_size", wanted.batch_size), ("max_batch_delay", wanted.batch_delay_ms)]
            return (Update(wanted.workers, tuple(params)),)
        return (Scale(wanted.workers),)  # only the workers move (the space was reduced to match)
    return _register(wanted, archive, capabilities, unregister=current is not None or registered)


def _register(wanted: Config, archive: str, capabilities: Capabilities, *, unregister: bool) -> tuple[Step, ...]:
    steps: list[Step] = [Unregister()] if unregister else []
    if capabilities.knobs_in_place and not default_knobs(wanted):
        # Workers start once, with their threads: registered with none, then scaled with the knobs in one call.
        steps += [Register(archive, wanted, 0), Update(wanted.workers, knob_params(without_knobs(wanted), wanted))]
    else:
        steps.append(Register(archive, wanted, wanted.workers))
    return tuple(steps)


def apply_step(step: Step, management: ManagementClient, name: str, url_of: Callable[[Register], str]) -> None:
    """Run one step for model ``name`` (``url_of(step)``: where a registration's archive comes from). Raises
    ManagementError, status 400, when the server answered a batching change but did not take it."""
    if isinstance(step, Unregister):
        management.unregister(name)
    elif isinstance(step, Register):
        c = step.config
        management.register(url_of(step), name, batch_size=c.batch_size, max_batch_delay=c.batch_delay_ms,
                            workers=step.workers)  # fmt: skip
    elif isinstance(step, Scale):
        management.scale(name, step.workers)
    else:
        params = dict(step.params)
        management.set(name, workers=step.workers, **params)
        if step.rebatches:
            described = management.describe(name)
            got = (described.get("batchSize"), described.get("maxBatchDelay"))
            if got != (params["batch_size"], params["max_batch_delay"]):
                raise ManagementError(
                    f"{name}: the server answered the batching change but reports batch size {got[0]}, "
                    f"delay {got[1]} (asked {params['batch_size']}, {params['max_batch_delay']})",
                    400,
                )


__all__ = [
    "NATIVE",
    "RAY",
    "THREAD_KNOBS",
    "TORCHSERVE",
    "Capabilities",
    "Register",
    "Scale",
    "Served",
    "Step",
    "Unregister",
    "Update",
    "apply_step",
    "archive_of",
    "default_knobs",
    "knob_params",
    "knobs_of",
    "plan_change",
    "without_knobs",
]
