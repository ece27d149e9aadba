"""The one small interface every policy implements (servetune's controller and the baselines alike), what a policy
sees, and the registry that chooses one by name (``controller.policy`` in the model's settings).

The controller (``control/controller.py``) does the measuring, the acting, the shedding and the logging; a policy only
decides: ``decide(view)`` every tick returns the knobs it wants (or None: as they are) with the figures behind them,
``observe(batch)`` sees every batch that finished (when ``observes``). Two flags say what else it uses: ``shed``
(admission control) and ``deadline_dispatch`` (a batch goes early when its oldest request would otherwise miss its
deadline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from servetune.control.estimate import ServiceFit
from servetune.control.law import Cost, ThreadCost, measured_bounds, rescaled
from servetune.control.settings import ControlSettings, Knobs
from servetune.registry import registered


@dataclass(frozen=True)
class BatchSeen:
    """One finished batch."""

    size: int
    reason: str  # "full", "delay", "deadline", "solo", "reserve"
    oldest_queue_ms: float  # the oldest request's wait before the batch went
    predicted_ms: float | None  # the batch's time as the fit predicted it at dispatch
    actual_ms: float  # dispatch to answers back
    worker: str


def thread_cost(fits: dict[int, ServiceFit], threads: int, batch_bounds: tuple[int, int]) -> ThreadCost | None:
    """What is known of a batch's cost at ``threads`` per worker (``fits``: one fit per thread count): that count's
    own fit once it tells b; else the nearest count whose fit does, rescaled (``law.rescaled``) and, where batches
    at ``threads`` were seen (all of one size, so b is not told yet), put through their mean. None: no fit tells b."""
    own = fits.get(threads)
    if own is not None:
        fitted, tilted = own.coefficients(), own.cautious()
        if fitted is not None and tilted is not None:
            return ThreadCost(Cost(*fitted), Cost(*tilted), measured_bounds(batch_bounds, own.largest))
    told = [(abs(k - threads), k) for k, fit in fits.items() if k != threads and fit.coefficients() is not None]
    if not told:
        return None
    base_k = min(told)[1]
    base = fits[base_k]
    line, high = base.coefficients(), base.cautious()
    assert line is not None and high is not None  # told b: both known
    cost, cautious = rescaled(Cost(*line), base_k, threads), rescaled(Cost(*high), base_k, threads)
    seen = own.mean() if own is not None else None
    if seen is not None and cost.t(seen[0]) > 0:  # the guessed line through what was measured at this count
        scale = seen[1] / cost.t(seen[0])
        cost, cautious = cost.scaled(scale), cautious.scaled(scale)
    largest = max(base.largest, own.largest if own is not None else 0)
    return ThreadCost(cost, cautious, measured_bounds(batch_bounds, largest))


@dataclass
class View:
    """What a policy sees at a tick."""

    now: float  # time.monotonic()
    elapsed_s: float  # since the controller started (the oracle's phases count from here)
    rate: float  # arrivals per second, last half second
    queue: int  # requests waiting
    ongoing: int  # requests waiting or running (Ray's autoscaling metric)
    knobs: Knobs  # as they are
    settings: ControlSettings
    fit: ServiceFit
    margin_ms: float  # the fit's error margin
    extra: dict[str, Any] = field(default_factory=dict)
    fits: dict[int, ServiceFit] = field(default_factory=dict)  # with ``bounds.threads``: one per thread count
    cores: int = 0  # the cores this model's workers may take between them (0: not told)
    late_share: float = 0.0  # of the requests answered in the last 5 s (since the workers last changed), the late
    late_second: float = 0.0  # in that time, the worst second's late share (of seconds with 100 answers or more)
    reserve: int = 0  # of the workers, how many are held in reserve (``Decision.reserve``)

    def thread_cost(self, threads: int) -> ThreadCost | None:
        """What is known of a batch at ``threads`` per worker (:func:`thread_cost`)."""
        return thread_cost(self.fits, threads, self.settings.batch_size)

    def cost(self) -> Cost | None:
        """The fitted cost, once b can be told; None before."""
        found = self.fit.coefficients()
        return Cost(*found) if found is not None else None

    def cautious_cost(self) -> Cost | None:
        """The fitted cost with b at its upper confidence bound (``ServiceFit.cautious``); None before b is told."""
        found = self.fit.cautious()
        return Cost(*found) if found is not None else None

    @property
    def workers_bounds(self) -> tuple[int, int]:
        """The workers bounds, or the current workers held when the settings give none."""
        bounds = self.settings.workers
        return bounds if bounds is not None else (self.knobs.workers, self.knobs.workers)


@dataclass(frozen=True)
class Decision:
    """New knobs and why (the prediction behind them, as the decision log records it)."""

    knobs: Knobs
    why: dict[str, Any]
    # of ``knobs.workers``, how many to hold in reserve: the newest, taking a batch only once its oldest request waited
    # past the law's worst case and no other worker took it (workers kept for bursts, not for the steady load)
    reserve: int = 0


class Policy(Protocol):
    name: str
    shed: bool
    deadline_dispatch: bool
    observes: bool  # whether ``observe`` learns from batches (False: the controller does not build what it would see)

    def decide(self, view: View) -> Decision | None:
        """The knobs to have now, or None to leave them."""
        ...

    def observe(self, batch: BatchSeen) -> None:
        """A batch finished."""
        ...


POLICIES: dict[str, str] = {
    "controller": "servetune.control.slo_policy:SloPolicy",
    "static": "servetune.control.baselines:Static",
    "greedy": "servetune.control.baselines:Greedy",
    "aimd": "servetune.control.baselines:Aimd",
    "lsq": "servetune.control.baselines:LeastSquares",
    "queue": "servetune.control.baselines:QueueScaling",
    "oracle": "servetune.control.baselines:Oracle",
}


def make_policy(settings: ControlSettings, registered_knobs: Knobs) -> Policy:
    """The policy ``settings.policy`` names, built for these settings and the model's knobs as registered."""
    cls = registered(POLICIES, settings.policy, f"controller.policy: unknown policy {settings.policy!r}")
    policy: Policy = cls(settings, registered_knobs)
    return policy


__all__ = ["POLICIES", "BatchSeen", "Decision", "Policy", "View", "make_policy", "thread_cost"]
