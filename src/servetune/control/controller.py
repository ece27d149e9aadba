"""One model version's controller: it measures (arrivals, every batch's time), asks its policy for knobs every tick,
acts through the backend's in-place changes (an :class:`Actuator`), sheds what cannot make its deadline, and logs
and counts every decision. Backend-neutral: the native server's model is its actuator (``server/model.py``).

What each request costs it: one counter (the arrival), and with shedding one completion prediction
(``law.completion_ms``); what each batch costs: the fit's update and one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from servetune._exceptions import ApiError
from servetune.control.decisions import DecisionLog
from servetune.control.estimate import RateMeter, ServiceFit, TailMeter
from servetune.control.law import SLACK_MS, Cost, completion_ms
from servetune.control.policy import BatchSeen, Decision, View, make_policy, thread_cost
from servetune.control.settings import ControlSettings, Knobs

log = logging.getLogger("servetune.control")

REASONS = ("full", "delay", "deadline", "solo", "reserve")
ERROR_DECAY = 0.98
MARGIN_SHARE = 0.15
MIN_SHED_BATCHES = 5  # a cold model sheds nothing: its first batches (a worker warming up) tell its cost poorly


class Actuator(Protocol):
    """What a backend lets the controller read and move, in place (the management API's own changes)."""

    def knobs(self) -> Knobs:
        """The knobs as they are now."""
        ...

    def queue_length(self) -> int: ...

    def set_batching(self, batch_size: int, max_batch_delay_ms: float) -> None:
        """From the next batch formed on."""
        ...

    async def set_workers(self, workers: int) -> None:
        """Start or retire workers (raises ApiError when the host's cores cannot hold them)."""
        ...

    def set_threads(self, threads: int) -> None:
        """Intra-op threads per worker, from the next batch each worker runs (ApiError: the pinned cores do not fit)."""
        ...

    def set_reserve(self, workers: int) -> None:
        """Hold the newest ``workers`` workers in reserve: each takes a batch only when its oldest request has waited
        past what the law allows for, and no other worker took it first (``reserve_by``; a backend of one worker per
        queue holds none)."""
        ...

    def cores(self) -> int:
        """The cores this model's workers may take between them: the host's, less what other models' workers take."""
        ...


class HeldKnobs:
    """An :class:`Actuator` that only holds the knobs and a queue length it is told: the controller run in process,
    with no model behind it (its overhead timed, its admission checked by hand)."""

    def __init__(self, knobs: Knobs, queue: int = 0, cores: int = 64) -> None:
        self.now = knobs
        self.queue = queue
        self.spare = cores
        self.reserve = 0

    def knobs(self) -> Knobs:
        return self.now

    def queue_length(self) -> int:
        return self.queue

    def set_batching(self, batch_size: int, max_batch_delay_ms: float) -> None:
        self.now = replace(self.now, batch_size=batch_size, max_batch_delay_ms=max_batch_delay_ms)

    async def set_workers(self, workers: int) -> None:
        self.now = replace(self.now, workers=workers)

    def set_threads(self, threads: int) -> None:
        self.now = replace(self.now, threads=threads)

    def set_reserve(self, workers: int) -> None:
        self.reserve = workers

    def cores(self) -> int:
        return self.spare


class Controller:
    def __init__(
        self,
        name: str,
        version: str,
        settings: ControlSettings,
        actuator: Actuator,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.version = version
        self.settings = settings
        self.actuator = actuator
        self.clock = clock
        self.policy = make_policy(settings, actuator.knobs())
        self.meter = RateMeter()
        self.tail = TailMeter()  # the share answered late lately: the law's predictions checked against the SLA
        # one fit per thread count when the policy moves threads (a batch at 2 threads costs other than at 1); else
        # one, under 0 (``_one``: read on every request without a lookup)
        self._one = ServiceFit() if settings.threads is None else None
        self.fits: dict[int, ServiceFit] = {0: self._one} if self._one is not None else {}
        self.log = DecisionLog(settings.log, settings.log_max_bytes)
        self.started = clock()
        self.inflight: dict[str, tuple[float, float, int]] = {}  # worker -> (dispatched at, predicted ms, threads)
        self.batches = dict.fromkeys(REASONS, 0)
        self.shed_count = 0
        self.knob_changes = 0
        self.reserve = 0  # of the workers, how many the policy holds in reserve (``reserve_by``)
        self.predicted_ms_sum = 0.0  # over the batches that had a prediction
        self.actual_ms_sum = 0.0
        self.predicted_batches = 0
        self.margin_ms = 0.0
        self._err2 = 0.0  # the predictions' squared error, averaged over the last ~50 batches
        self.last_error = ""
        self._running_requests = 0  # requests in the batches running (Ray's ongoing requests, with the queue)
        self._cost: Cost | None = None
        self._scaling: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._worker_cap: int | None = None  # the most workers the host held when more were refused

    # ---- life --------------------------------------------------------------------------------

    def start(self) -> None:
        self.started = self.clock()
        self._task = asyncio.create_task(self._loop(), name=f"controller-{self.name}-{self.version}")

    async def close(self) -> None:
        for task in (self._task, self._scaling):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.log.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            try:
                await self.tick()
            except Exception:  # the controller's fault must never stop the model serving
                log.exception("controller of %s version %s: tick failed", self.name, self.version)

    # ---- what a policy sees ------------------------------------------------------------------

    def _threads_key(self) -> int:
        """The fit a batch dispatched now belongs to: its threads per worker when the policy moves them, else 0."""
        return 0 if self._one is not None else self.actuator.knobs().threads

    @property
    def fit(self) -> ServiceFit:
        """The fit of the threads per worker now (the only one, when threads are not moved)."""
        if self._one is not None:
            return self._one
        key = self._threads_key()
        fit = self.fits.get(key)
        if fit is None:
            fit = self.fits[key] = ServiceFit()
        return fit

    def view(self) -> View:
        now = self.clock()
        queue = self.actuator.queue_length()
        ongoing = queue + self._running_requests
        return View(
            now=now,
            elapsed_s=now - self.started,
            rate=self.meter.rate(now),
            queue=queue,
            ongoing=ongoing,
            knobs=self.actuator.knobs(),
            settings=self.settings,
            fit=self.fit,
            margin_ms=self.margin_ms,
            fits=self.fits,
            cores=self.actuator.cores() if self.settings.threads is not None else 0,
            late_share=self.tail.share(now),
            late_second=self.tail.worst_second(now),
            reserve=self.reserve,
        )

    async def tick(self) -> None:
        """Ask the policy, apply what it decided (workers on their own task: a worker takes seconds to start)."""
        # the margin: twice the predictions' recent RMS error, at most MARGIN_SHARE of the target
        self.margin_ms = min(2.0 * math.sqrt(self._err2), MARGIN_SHARE * self.settings.target_ms)
        self._refresh_cost()
        view = self.view()
        decision = self.policy.decide(view)
        if decision is not None:
            self.apply(view, decision)
        self.log.flush()

    def _refresh_cost(self) -> None:
        if self.settings.threads is not None:  # a thread count not measured yet: guessed from one that was
            known = thread_cost(self.fits, self._threads_key(), self.settings.batch_size)
            if known is not None:
                self._cost = known.cost
                return
        found = self.fit.coefficients()
        if found is not None:
            self._cost = Cost(*found)
            return
        seen = self.fit.mean()
        # b not told yet: admission takes a batch to cost what the batches seen cost, whatever its size (it sheds
        # only what is late even so), and the policy keeps the registered cap within what that cost makes safe
        self._cost = Cost(seen[1], 0.0) if seen is not None else None

    def apply(self, view: View, decision: Decision) -> None:
        old, new = view.knobs, decision.knobs
        if not new.threads or self.settings.threads is None:  # threads are moved only within bounds.threads
            new = replace(new, threads=old.threads)
        if self._worker_cap is not None and new.workers > self._worker_cap:
            new = replace(new, workers=self._worker_cap)
        reserve = max(0, min(decision.reserve, new.workers - 1))
        if new == old and reserve == self.reserve:
            return
        if (new.batch_size, new.max_batch_delay_ms) != (old.batch_size, old.max_batch_delay_ms):
            self.actuator.set_batching(new.batch_size, new.max_batch_delay_ms)
        if new.threads != old.threads:  # before any scale: fewer threads first, so that more workers fit the cores
            try:
                self.actuator.set_threads(new.threads)
            except ApiError as exc:
                self.last_error = exc.message
                log.warning("controller of %s: %d threads refused: %s", self.name, new.threads, exc.message)
                new = replace(new, threads=old.threads)
        if new.workers != old.workers:
            if self._scaling is not None and not self._scaling.done():
                new = replace(new, workers=old.workers)  # one scale at a time
            else:
                self._scaling = asyncio.create_task(self._scale(new.workers))
                self.tail.clear()  # what came late with the workers before says nothing of these
        reserve = min(reserve, new.workers - 1)  # the scale may have been held back
        old_reserve = self.reserve
        if reserve != old_reserve:
            self.actuator.set_reserve(reserve)
            self.reserve = reserve
        if new == old and reserve == old_reserve:
            return
        self.knob_changes += 1
        self.log.change(
            {
                "t": round(view.elapsed_s, 3),
                "kind": "knobs",
                "policy": self.policy.name,
                "old": {**old.to_json(), "reserve": old_reserve},
                "new": {**new.to_json(), "reserve": reserve},
                "rate": round(view.rate, 1),
                "queue": view.queue,
                "why": decision.why,
            }
        )

    async def _scale(self, workers: int) -> None:
        try:
            await self.actuator.set_workers(workers)
        except ApiError as exc:  # the host's cores are held by other models: stay within what fits
            self._worker_cap = self.actuator.knobs().workers
            self.last_error = exc.message
            log.warning("controller of %s: %d workers refused: %s", self.name, workers, exc.message)
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("controller of %s: scaling to %d workers failed", self.name, workers)

    # ---- requests ----------------------------------------------------------------------------

    def admit(self, arrival: float, deadline: float | None) -> None:
        """Count the arrival; with shedding, raise ApiError 503 (Retry-After) when the request is predicted to miss
        its deadline: the SLA's (arrival + target), or the client's own when sooner.

        An idle model (a worker free, nothing queued) sheds only on a client's own deadline: shedding on the SLA's
        protects the requests behind a late one, and there are none; and the prediction is then the fit's alone,
        which only served batches correct (a fit learned from a cold worker's first, slow batches would otherwise
        shed every request from then on, and nothing would ever correct it)."""
        self.meter.arrive(arrival)
        if not self.policy.shed:
            return
        cost = self._cost
        if cost is None or self.fit.count < MIN_SHED_BATCHES:
            return
        limit = arrival + self.settings.target_ms / 1000.0
        own = False  # the client's own deadline is the sooner
        if deadline is not None and deadline < limit:
            limit, own = deadline, True
        knobs = self.actuator.knobs()
        queue = self.actuator.queue_length()
        if not own and queue == 0 and len(self.inflight) < knobs.workers:
            return
        now = self.clock()
        busy = [(start + predicted / 1000.0 - now) * 1000.0 for start, predicted, _ in self.inflight.values()]
        rate = self.meter.rate(now)
        wait_ms = completion_ms(cost, queue, knobs.batch_size, busy, knobs.workers, knobs.max_batch_delay_ms, rate)
        # the answer must also cross the frontend and the network inside the deadline, and the prediction may err
        if now + (wait_ms + self.margin_ms + SLACK_MS) / 1000.0 <= limit:
            return
        self.shed_count += 1
        self.log.shed(now - self.started, wait_ms, (limit - now) * 1000.0, self.margin_ms, queue, len(busy), own)
        retry = max(1, math.ceil(wait_ms / 1000.0))
        raise ApiError(
            f"Model {self.name} would answer in {wait_ms:.0f} ms, past the request's deadline "
            f"({(limit - arrival) * 1000.0:.0f} ms after its arrival): shed (retry after {retry} s)",
            503,
            "ServiceUnavailableException",
            {"Retry-After": str(retry)},
        )

    def dispatch_by(self, first_arrival: float, queued: int) -> float:
        """The latest time the batch that ``first_arrival`` opened may go and its oldest request still make the SLA
        (infinity when the policy does not dispatch on deadlines, or before the cost is known)."""
        cost = self._cost
        if cost is None or not self.policy.deadline_dispatch:
            return math.inf
        n = min(queued, self.actuator.knobs().batch_size)
        return first_arrival + (self.settings.target_ms - cost.t(n) - self.margin_ms - SLACK_MS) / 1000.0

    def reserve_by(self, first_arrival: float, queued: int) -> float:
        """When a worker held in reserve takes the batch ``first_arrival`` opened: once its oldest request has waited
        longer than the law lets a request wait for a collecting worker (under load the W collecting workers free one
        every t(cap)/W), or at ``dispatch_by`` if sooner; infinity before the cost is known."""
        cost = self._cost
        if cost is None or not self.policy.deadline_dispatch:
            return math.inf
        knobs = self.actuator.knobs()
        collecting = max(1, knobs.workers - self.reserve)
        waited = first_arrival + cost.t(knobs.batch_size) / collecting / 1000.0
        return min(waited, self.dispatch_by(first_arrival, queued))

    # ---- batches -----------------------------------------------------------------------------

    def dispatched(self, worker: str, size: int) -> float:
        """A batch went to ``worker``; returns its predicted time (ms; NaN before the cost is known)."""
        cost = self._cost
        predicted = cost.t(size) if cost is not None else math.nan
        self.inflight[worker] = (self.clock(), predicted if cost is not None else 0.0, self._threads_key())
        self._running_requests += size
        return predicted

    def finished(
        self, worker: str, size: int, reason: str, oldest_queue_ms: float, predicted_ms: float, actual_ms: float
    ) -> None:
        """The batch ``dispatched`` announced is answered (or failed: then ``actual_ms`` is NaN and nothing is
        learnt from it)."""
        running = self.inflight.pop(worker, None)
        self._running_requests = max(0, self._running_requests - size)
        self.batches[reason] = self.batches.get(reason, 0) + 1
        if math.isnan(actual_ms):
            return
        key = running[2] if running is not None else self._threads_key()  # the threads the batch ran with
        fit = self._one or self.fits.get(key)
        if fit is None:
            fit = self.fits[key] = ServiceFit()
        fit.add(size, actual_ms)
        now = self.clock()
        self.tail.add(now, size, late_in_batch(size, oldest_queue_ms, actual_ms, self.settings.target_ms - SLACK_MS))
        if not math.isnan(predicted_ms):
            error = actual_ms - predicted_ms
            self._err2 = ERROR_DECAY * self._err2 + (1.0 - ERROR_DECAY) * error * error
            self.predicted_batches += 1
            self.predicted_ms_sum += predicted_ms
            self.actual_ms_sum += actual_ms
        known = None if math.isnan(predicted_ms) else predicted_ms
        if self.policy.observes:
            self.policy.observe(BatchSeen(size, reason, oldest_queue_ms, known, actual_ms, worker))
        self.log.batch(now - self.started, worker, reason, size, oldest_queue_ms, known, actual_ms, key)

    # ---- describe ----------------------------------------------------------------------------

    def _by_threads(self) -> dict[str, Any]:
        """With ``bounds.threads``: each thread count's fit (``fit`` is the one of the threads now)."""
        if self.settings.threads is None:
            return {}
        return {"fitByThreads": {str(k): _fit_json(fit) for k, fit in sorted(self.fits.items())}}

    def describe(self) -> dict[str, Any]:
        now = self.clock()
        found = self.fit.coefficients()
        knobs = self.actuator.knobs()
        return {
            "policy": self.policy.name,
            "settings": self.settings.to_json(),
            "state": "fitted" if found is not None else ("measuring" if self.fit.count else "waiting"),
            "knobs": knobs.to_json(),
            "reserveWorkers": self.reserve,
            "arrivalRate": round(self.meter.rate(now), 2),
            "lateShare": round(self.tail.share(now), 4),
            "lateSecond": round(self.tail.worst_second(now), 4),
            **self._by_threads(),
            "fit": {
                "a_ms": round(found[0], 3) if found else None,
                "b_ms": round(found[1], 3) if found else None,
                "b_stderr_ms": _finite(self.fit.b_stderr()),
                "spread_ms": round(self.fit.spread_ms(), 3),
                "margin_ms": round(self.margin_ms, 3),
                "batches": self.fit.count,
                "largest": self.fit.largest,
            },
            "batches": dict(self.batches),
            "shed": self.shed_count,
            "knobChanges": self.knob_changes,
            "recentChanges": list(self.log.recent),
            **({"lastError": self.last_error} if self.last_error else {}),
        }


def late_in_batch(size: int, oldest_queue_ms: float, actual_ms: float, limit_ms: float) -> int:
    """How many of a batch's requests waited and ran past ``limit_ms``: its requests arrived over its oldest one's
    wait, taken as evenly spread; those that waited more than ``limit - actual`` are late (the oldest, at least, when
    it is)."""
    if oldest_queue_ms + actual_ms <= limit_ms:
        return 0
    if oldest_queue_ms <= 0.0:
        return size
    waited_too_long = min(1.0, (oldest_queue_ms - max(0.0, limit_ms - actual_ms)) / oldest_queue_ms)
    return max(1, min(size, math.ceil(size * waited_too_long - 1e-9)))


def _fit_json(fit: ServiceFit) -> dict[str, Any]:
    found = fit.coefficients()
    return {
        "a_ms": round(found[0], 3) if found else None,
        "b_ms": round(found[1], 3) if found else None,
        "batches": fit.count,
        "largest": fit.largest,
    }


def _finite(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None


__all__ = ["MIN_SHED_BATCHES", "REASONS", "Actuator", "Controller", "HeldKnobs", "late_in_batch"]
