"""The online controller (``servetune.control``) on the Ray backend: one controller in each replica, over that
replica's own batch queue (``@serve.batch``).

Ray's proxy spreads requests over the replicas, and each replica batches what it is given, so a replica is a model
with one worker and a queue of its own; its controller measures that replica's arrivals and batches, moves its batch
size and delay in place (``set_max_batch_size`` / ``set_batch_wait_timeout_s``, from the next batch), and, with
``shed: true``, answers 503 at once what its queue cannot finish by the deadline. What Ray keeps: the replicas (its
autoscaling, ``minWorkers`` < ``maxWorkers``) and a replica's threads (its CPUs are reserved when Ray starts it);
bounds on those are refused at registration (``ray/plan.py``: :func:`~servetune.ray.plan.ray_control`). A batch goes
when it is full or its delay ran out (``@serve.batch`` has no early dispatch on a deadline), so a batch's reason is
``full`` or ``delay``.

Each replica reports its controller's state with its metrics (``ray/metrics.py``); the driver's ``describe`` shows
every replica's, and the metrics carry a ``worker_id`` label (the replica's pid). A decision log path gets the
replica's pid before its suffix (``decisions.jsonl`` -> ``decisions.<pid>.jsonl``): replicas never share a file.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from servetune._exceptions import ApiError, ConfigError
from servetune.api.types import InferRequest, InferResult
from servetune.control import Controller, ControlSettings, Knobs
from servetune.control.metrics import ControllerMetrics
from servetune.control.settings import PROBES, unreachable
from servetune.handlers.service import InputParam, Request, Service

if TYPE_CHECKING:
    from servetune.ray.replica import ModelReplica


class ReplicaActuator:
    """One replica as its controller reads and moves it: one worker, its own queue."""

    def __init__(self, replica: ModelReplica) -> None:
        self.replica = replica
        self._held: tuple[int, float] | None = None
        self._knobs: Knobs | None = None

    def knobs(self) -> Knobs:
        held = (self.replica.batch_size, self.replica.max_batch_delay_ms)
        if held != self._held or self._knobs is None:
            self._held, self._knobs = held, Knobs(held[0], held[1], 1)
        return self._knobs

    def queue_length(self) -> int:
        return len(self.replica.waiting)

    def set_batching(self, batch_size: int, max_batch_delay_ms: float) -> None:
        self.replica.set_batching(batch_size, max_batch_delay_ms)

    async def set_workers(self, workers: int) -> None:
        raise ApiError.bad_request("the Ray backend scales replicas itself (minWorkers < maxWorkers)")

    def set_threads(self, threads: int) -> None:
        raise ApiError.bad_request("a replica's threads are fixed when Ray reserves its CPUs")

    def set_reserve(self, workers: int) -> None:
        """A replica is one worker: none is held in reserve (its policy never asks, its workers are fixed at 1)."""

    def cores(self) -> int:
        return 1


class ReplicaController(Controller):
    """A :class:`~servetune.control.Controller` that times the batches of the replica it runs in."""

    def __init__(self, replica: ModelReplica, settings: ControlSettings) -> None:
        plan = replica.plan
        super().__init__(plan.name, plan.version, settings, ReplicaActuator(replica))
        self.replica = replica
        self.worker = str(os.getpid())

    def ensure_started(self) -> None:
        """Start the tick loop on the replica's event loop (there is none yet when the replica is built)."""
        if self._task is None:
            self.start()

    async def run(
        self, requests: list[InferRequest], run: Callable[[list[InferRequest]], Awaitable[list[InferResult]]]
    ) -> list[InferResult]:
        """Run one batch through ``run``, telling the controller it went and how long it took (NaN: it failed)."""
        size = len(requests)
        reason = "full" if size >= self.replica.batch_size else "delay"
        started = time.monotonic()
        oldest_queue_ms = (started - min(r.arrival for r in requests)) * 1000.0
        predicted = self.dispatched(self.worker, size)
        actual = math.nan
        try:
            results = await run(requests)
            if self.replica.stuck is None:
                actual = (time.monotonic() - started) * 1000.0
            return results
        finally:
            self.finished(self.worker, size, reason, oldest_queue_ms, predicted, actual)


def check_reachable(service: Service, settings: ControlSettings) -> float | None:
    """Run ``controller.probe`` (a request body) through the replica's handler a few times, alone, before the
    replica serves; ConfigError naming the SLA's key when its fastest run took longer than the SLA allows (the
    replica then fails to load, and the registration with it). Returns that batch-1 time (ms); None: no probe."""
    if settings.probe is None:
        return None
    body = settings.probe.encode()
    best = math.inf
    for i in range(PROBES):
        started = time.monotonic()
        service.predict([Request(f"controller-probe-{i}", {}, [InputParam("body", None, body)])])
        best = min(best, (time.monotonic() - started) * 1000.0)
    refused = unreachable(settings, best, "when the replica loaded")
    if refused is not None:
        raise ConfigError(refused)
    return best


def replica_log(path: str | None, pid: int) -> str | None:
    """The decision log of the replica ``pid``: the model's path with the pid before its suffix."""
    if path is None:
        return None
    log = Path(path)
    return str(log.with_name(f"{log.stem}.{pid}{log.suffix}"))


def replica_controller(
    replica: ModelReplica, settings: ControlSettings | None, registry: CollectorRegistry
) -> ReplicaController | None:
    """The replica's controller (None: the model has no ``controller:``), its metrics in ``registry``."""
    if settings is None:
        return None
    settings = replace(settings, log=replica_log(settings.log, os.getpid()))
    controller = ReplicaController(replica, settings)
    registry.register(ControllerMetrics(lambda: [controller], {"worker_id": controller.worker}))
    return controller


__all__ = [
    "ReplicaActuator",
    "ReplicaController",
    "check_reachable",
    "replica_controller",
    "replica_log",
]
