"""The native server's side of the online controller (``servetune.control``): a model version's settings read from
its plan, the model as the controller's :class:`~servetune.control.Actuator` (the same in-place changes the
management API makes: batch size and delay from the next batch, workers scaled through the placement, which refuses
cores other models hold), and the registration check that the SLA is reachable at all.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from servetune._exceptions import ApiError, ConfigError
from servetune.api.plan import VersionPlan
from servetune.api.types import InferRequest, Input
from servetune.control import ControlSettings, Knobs, parse_settings
from servetune.control.settings import PROBES, unreachable

if TYPE_CHECKING:
    from servetune.server.model import ServedModel


def control_settings(plan: VersionPlan, max_workers: int) -> ControlSettings | None:
    """The version's ``controller:`` settings (model-config.yaml or its ``models=`` entry), None when it has none;
    ApiError 400 naming the key when they are invalid."""
    raw = plan.config.handler_config.get("controller")
    if raw is None:
        return None
    try:
        return parse_settings(raw, source=f"{plan.url}: model-config.yaml", max_workers=max_workers)
    except ConfigError as exc:
        raise ApiError.bad_request(str(exc)) from None


class ModelActuator:
    """A served model as its controller reads and moves it."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model
        self._held: tuple[int, float, int, int] | None = None
        self._knobs: Knobs | None = None
        # threads are a knob only when the controller moves them (bounds.threads): else 0, "as they are"
        self._threads = model.control is not None and model.control.threads is not None

    def knobs(self) -> Knobs:
        """Read on every admission: built again only when a knob moved (a Knobs built costs ~1 µs)."""
        model = self.model
        batcher = model.batcher
        placement = model.placement.generation if self._threads else -1  # the threads change only with it
        held = (batcher.batch_size, batcher.max_delay_s, model.min_workers, placement)
        if held != self._held or self._knobs is None:
            threads = model.placement.threads(model.key) if self._threads else 0
            self._held, self._knobs = held, Knobs(held[0], held[1] * 1000.0, held[2], threads)
        return self._knobs

    def queue_length(self) -> int:
        return len(self.model.batcher)

    def set_batching(self, batch_size: int, max_batch_delay_ms: float) -> None:
        self.model.set_batching(batch_size, max_batch_delay_ms)

    async def set_workers(self, workers: int) -> None:
        model = self.model
        await model.scale(workers, max(workers, model.max_workers))

    def set_threads(self, threads: int) -> None:
        self.model.set_threads(threads)

    def set_reserve(self, workers: int) -> None:
        self.model.pool.set_reserve(workers)

    def cores(self) -> int:
        return self.model.placement.spare_cores(self.model.key)


async def check_reachable(model: ServedModel, settings: ControlSettings) -> float | None:
    """Run ``controller.probe`` (a request body) through the model a few times, alone; ApiError 400 naming the SLA's
    key when its fastest answer took longer than the SLA allows. Returns that batch-1 time (ms); None: no probe."""
    if settings.probe is None:
        return None
    body = settings.probe.encode()
    best = float("inf")
    for i in range(PROBES):
        started = time.monotonic()
        request = InferRequest(f"controller-probe-{i}", {}, [Input("body", None, body)], started)
        await model.submit(request)
        best = min(best, (time.monotonic() - started) * 1000.0)
    refused = unreachable(settings, best, "at registration")
    if refused is not None:
        raise ApiError.bad_request(refused)
    return best


__all__ = ["ModelActuator", "check_reachable", "control_settings"]
