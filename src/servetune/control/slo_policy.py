"""servetune's own policy: the control law (``control/law.py``) on the fitted cost and the measured rate, with
hysteresis, deadline dispatch and (with ``shed: true``) admission control.

Hysteresis: a change that serves more load (more workers, a longer delay because the rate rose) or follows the fit
applies at the next tick, so a load step is met within the meter's window (0.5 s) plus a tick (0.1 s); a change
back (fewer workers, a shorter delay) applies only once the law has asked for it for ``HOLD_S`` (workers:
``WORKERS_HOLD_S``), and small changes (under ``DEADBAND``) never apply: the knobs do not flap on a rate that
wobbles.
"""

from __future__ import annotations

from servetune.control.law import SLACK_MS, batch_cap, decide
from servetune.control.policy import BatchSeen, Decision, View
from servetune.control.settings import ControlSettings, Knobs

HOLD_S = 2.0
WORKERS_HOLD_S = 20.0
DEADBAND = 0.15  # relative change below which a knob stays


class SloPolicy:
    """The control law with hysteresis (see the module)."""

    name = "controller"
    deadline_dispatch = True

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        self.settings = settings
        self.shed = settings.shed
        self.registered = registered
        self._lower_since: float | None = None
        self._fewer_since: float | None = None
        self._started = False

    def observe(self, batch: BatchSeen) -> None:
        """The fit is the controller's; nothing of its own to learn."""

    def decide(self, view: View) -> Decision | None:
        s = self.settings
        # Until the fit can tell b (batches of two sizes), the knobs stay as registered: a cap set from a guess
        # could keep every batch at one size, and b would never be told; the load itself varies the batches.
        cost = view.cost()
        if cost is None:
            if self._started:
                return None
            self._started = True  # before any batch: the registered knobs within bounds, no delay
            first = Knobs(
                max(s.batch_size[0], min(s.batch_size[1], self.registered.batch_size)),
                float(s.max_batch_delay_ms[0]),
                view.knobs.workers,
            )
            return Decision(first, {"start": True}) if first != view.knobs else None
        self._started = True
        # a backlog is load too: what waits should drain within a second
        rate = view.rate + view.queue
        law = decide(cost, rate, s.target_ms, view.margin_ms, s.batch_size, s.max_batch_delay_ms, view.workers_bounds)
        want, now = law.knobs, view.knobs
        why = {"law": law.to_json(), "a_ms": round(cost.a_ms, 3), "b_ms": round(cost.b_ms, 3)}
        # workers: up at once, down after WORKERS_HOLD_S
        workers = now.workers
        if want.workers > now.workers:
            workers, self._fewer_since = want.workers, None
        elif want.workers < now.workers:
            self._fewer_since = self._fewer_since if self._fewer_since is not None else view.now
            if view.now - self._fewer_since >= WORKERS_HOLD_S:
                workers, self._fewer_since = want.workers, None
        else:
            self._fewer_since = None
        if workers != want.workers:  # workers held: the cap those allow
            budget = s.target_ms - view.margin_ms - SLACK_MS
            cap = batch_cap(cost, budget, want.max_batch_delay_ms, s.batch_size, workers)
            want = Knobs(cap, want.max_batch_delay_ms, want.workers)
        # batching: at once, except a shorter delay (the load fell), which waits HOLD_S
        batch, delay = now.batch_size, now.max_batch_delay_ms
        differs = _far(want.batch_size, batch, 1.0) or _far(want.max_batch_delay_ms, delay, 1.0)
        urgent = want.max_batch_delay_ms >= delay  # the load rose, or the fit moved: at once; a shorter delay waits
        if differs and urgent:
            batch, delay, self._lower_since = want.batch_size, want.max_batch_delay_ms, None
        elif differs:
            self._lower_since = self._lower_since if self._lower_since is not None else view.now
            if view.now - self._lower_since >= HOLD_S:
                batch, delay, self._lower_since = want.batch_size, want.max_batch_delay_ms, None
        else:
            self._lower_since = None
        chosen = Knobs(batch, delay, workers)
        return Decision(chosen, why) if chosen != now else None


def _far(new: float, old: float, floor: float) -> bool:
    """Differs by more than the deadband (relative) and more than ``floor`` (absolute)."""
    return abs(new - old) > max(floor - 1e-9, DEADBAND * abs(old))


__all__ = ["DEADBAND", "HOLD_S", "WORKERS_HOLD_S", "SloPolicy"]
