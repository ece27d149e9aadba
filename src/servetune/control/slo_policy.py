"""servetune's own policy: the control law (``control/law.py``) on the fitted cost and the measured rate, with
hysteresis, deadline dispatch and (with ``shed: true``) admission control.

What the fit can tell: the law sizes the cap on the fit's cautious cost (b at its upper confidence bound) and within
``EXTRAPOLATE`` times the largest batch measured, so a fit from small batches cannot put the cap at its bound.

Hysteresis: a change that serves more load applies at the next tick (more workers; a longer delay; a larger cap
when the batch the load needs is larger than the cap, or with a change of workers), so a load step is met within
the meter's window (0.5 s) plus a tick (0.1 s). Any other change waits until the law has asked for it for
``HOLD_S`` without a break (workers: ``WORKERS_HOLD_S``), and then takes the least change asked in that time: a cap
that the margin or the fit moves back and forth stays put. A smaller cap applies at once only when the cap now is
predicted to miss the SLA even with no margin. Changes under ``DEADBAND`` (and under one request or 1 ms) never
apply: the knobs do not flap on a rate that wobbles.
"""

from __future__ import annotations

from servetune.control.law import SLACK_MS, Cost, batch_cap, decide, measured_bounds, wait_factor
from servetune.control.policy import BatchSeen, Decision, View
from servetune.control.settings import ControlSettings, Knobs

HOLD_S = 2.0
WORKERS_HOLD_S = 20.0
DEADBAND = 0.15  # relative change below which a knob stays


class SloPolicy:
    """The control law with hysteresis (see the module)."""

    name = "controller"
    observes = False  # the fit is the controller's own
    deadline_dispatch = True

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        self.settings = settings
        self.shed = settings.shed
        self.registered = registered
        self._lower_since: float | None = None
        self._fewer_since: float | None = None
        self._cap_since: float | None = None  # since when the law has asked for a cap on one side of the cap now
        self._cap_up = False  # that side: above
        self._cap_asked = 0  # the least change asked since then
        self._started = False

    def observe(self, batch: BatchSeen) -> None:
        """The fit is the controller's; nothing of its own to learn."""

    def decide(self, view: View) -> Decision | None:
        s = self.settings
        # Until the fit can tell b (batches of two sizes), the cap is the registered one, but no larger than what
        # the batches seen say is safe if a batch costs in proportion to its size (the pessimistic guess), and never
        # under 2: a cap of 1 would keep every batch at one size, and b would never be told.
        cost, cautious = view.cost(), view.cautious_cost()
        if cost is None or cautious is None:
            cap = max(s.batch_size[0], min(s.batch_size[1], self.registered.batch_size))
            seen = view.fit.mean()
            why: dict[str, object] = {"start": True}
            if seen is not None:
                per_request = seen[1] / seen[0]
                budget = s.target_ms - view.margin_ms - SLACK_MS
                safe = max(2, batch_cap(Cost(0.0, per_request), budget, s.max_batch_delay_ms[0], s.batch_size,
                                        view.knobs.workers))  # fmt: skip
                cap = max(s.batch_size[0], min(cap, safe))
                why = {"uncalibrated": {"per_request_ms": round(per_request, 3), "safe_cap": safe}}
            if self._started and cap >= view.knobs.batch_size:
                return None  # a smaller cap applies at once; the registered one is never exceeded
            self._started = True  # before any batch: the registered knobs within bounds, no delay
            first = Knobs(cap, float(s.max_batch_delay_ms[0]), view.knobs.workers)
            return Decision(first, why) if first != view.knobs else None
        self._started = True
        # a backlog is load too: what waits should drain within a second
        rate = view.rate + view.queue
        bounds = measured_bounds(s.batch_size, view.fit.largest)
        law = decide(
            cost, rate, s.target_ms, view.margin_ms, bounds, s.max_batch_delay_ms, view.workers_bounds, cautious
        )
        want, now = law.knobs, view.knobs
        why = {
            "law": law.to_json(),
            "a_ms": round(cost.a_ms, 3),
            "b_ms": round(cost.b_ms, 3),
            "b_cautious_ms": round(cautious.b_ms, 3),
            "largest": view.fit.largest,
        }
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
        budget = s.target_ms - view.margin_ms - SLACK_MS
        if workers != want.workers:  # workers held: the cap those allow
            want = Knobs(
                batch_cap(cautious, budget, want.max_batch_delay_ms, bounds, workers), want.max_batch_delay_ms, workers
            )
        # the delay: longer at once, shorter after HOLD_S
        delay = now.max_batch_delay_ms
        if not _far(want.max_batch_delay_ms, delay, 1.0):
            self._lower_since = None
        elif want.max_batch_delay_ms > delay:
            delay, self._lower_since = want.max_batch_delay_ms, None
        else:
            self._lower_since = self._lower_since if self._lower_since is not None else view.now
            if view.now - self._lower_since >= HOLD_S:
                delay, self._lower_since = want.max_batch_delay_ms, None
        # the cap: at once when the load needs more, or the workers change, or the cap now is a sure miss
        urgent_up = law.n_need > now.batch_size or workers != now.workers
        worst_now = delay + wait_factor(workers) * cautious.t(now.batch_size)
        urgent_down = worst_now > s.target_ms - SLACK_MS
        batch = self._cap(view.now, now.batch_size, want.batch_size, urgent_up, urgent_down)
        chosen = Knobs(batch, delay, workers)
        return Decision(chosen, why) if chosen != now else None

    def _cap(self, now: float, cap: int, want: int, urgent_up: bool, urgent_down: bool) -> int:
        """The batch cap after hysteresis: ``want`` at once when urgent in its direction; else only once the law
        has asked for a cap on the same side of ``cap`` (past the deadband) for HOLD_S, the least change asked."""
        if not _far(want, cap, 1.0):
            self._cap_since = None
            return cap
        up = want > cap
        if (up and urgent_up) or (not up and urgent_down):
            self._cap_since = None
            return want
        if self._cap_since is None or self._cap_up != up:
            self._cap_since, self._cap_up, self._cap_asked = now, up, want
        else:
            self._cap_asked = min(self._cap_asked, want) if up else max(self._cap_asked, want)
        if now - self._cap_since >= HOLD_S:
            self._cap_since = None
            return self._cap_asked
        return cap


def _far(new: float, old: float, floor: float) -> bool:
    """Differs by more than the deadband (relative) and more than ``floor`` (absolute)."""
    return abs(new - old) > max(floor - 1e-9, DEADBAND * abs(old))


__all__ = ["DEADBAND", "HOLD_S", "WORKERS_HOLD_S", "SloPolicy"]
