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

The tail checks the law: the law's worst case takes the workers' batches as staggered, and Poisson bursts at
ρ = 0.8 queue past it. When more than the SLA's share (``TAIL_SHARE``: 1% for a P99, 5% for a P95; a mean has no
tail to check) of the answers since the workers last changed (within 5 s), or of any second in that time with 100
answers or more, came late, one worker more than there are is asked at once (within bounds); while any came late,
none fewer. A count the tail asked for past the law is remembered with the rate it was needed at (the least, if
asked again) and held while the rate stays within ``DEADBAND`` of it: without it the law took the worker back 20 s
later and the same load was late again.

The workers past the law's count (the tail's, the held ones, those waiting out ``WORKERS_HOLD_S``) are held in
reserve (``Decision.reserve``): each takes a batch only once its oldest request has waited longer than the law lets a
request wait for a collecting worker (t(cap)/W; ``Controller.reserve_by``) and no other worker took it, and the cap
is the law's for the workers that collect. None is held while the law's cap is the bounds' least batch: the batches
are of that size with or without a worker held back, which would only make requests wait. A worker kept for the
bursts then leaves the steady load's batches as large as the law's workers form them: a batch costs CPU of its
own (a known-cost model's full run: 56,679 batches of 2.67 requests against static's 48,139 of 3.14, 5% more CPU
per good answer, with the tail's workers collecting like the others).

Before b is told, the workers are as many as a batch costing in proportion to its size needs (up only).

Threads per worker (only with ``bounds.threads``; ``law.decide_threads``): more at once, as far as the cores hold
them beside the workers; fewer after ``HOLD_S``, or at once when more workers would not fit the cores otherwise.
Before b is told, a batch of one that misses the SLA at the threads now asks for one more.
"""

from __future__ import annotations

import math
from dataclasses import replace

from servetune.control.law import (
    GAIN_FLOOR,
    GAIN_KEPT,
    RHO,
    SLACK_MS,
    Cost,
    LawResult,
    ThreadCost,
    batch_cap,
    batch_needed,
    batching_gain,
    decide,
    decide_threads,
    measured_bounds,
    useful_cap,
    wait_factor,
)
from servetune.control.policy import BatchSeen, Decision, View
from servetune.control.settings import ControlSettings, Knobs

HOLD_S = 2.0
WORKERS_HOLD_S = 20.0
DEADBAND = 0.15  # relative change below which a knob stays
# late answers past the SLA's share of the recent ones ask for one worker more (a mean SLA has no tail to check)
TAIL_SHARE = {"p99_ms": 0.01, "p95_ms": 0.05}


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
        self._fewer_threads_since: float | None = None
        self._cap_since: float | None = None  # since when the law has asked for a cap on one side of the cap now
        self._cap_up = False  # that side: above
        self._cap_asked = 0  # the least change asked since then
        self._cap_held = 0.0  # how long the law had asked for the cap last applied (0: at once)
        self._started = False
        self._tail_rates: dict[int, float] = {}  # workers the tail asked for past the law -> the least rate it did
        self._fewer_collect_since: float | None = None  # since when the law has asked for fewer collecting workers

    def observe(self, batch: BatchSeen) -> None:
        """The fit is the controller's; nothing of its own to learn."""

    def decide(self, view: View) -> Decision | None:
        # Until the fit can tell b (batches of two sizes), the cap is the registered one, but no larger than what
        # the batches seen say is safe if a batch costs in proportion to its size (the pessimistic guess), and never
        # under 2: a cap of 1 would keep every batch at one size, and b would never be told.
        s = self.settings
        now = view.knobs
        if s.threads is not None:  # the cost at the threads now: its own fit, or guessed from another count's
            known = view.thread_cost(now.threads)
            cost, cautious = (known.cost, known.cautious) if known is not None else (None, None)
        else:
            cost, cautious = view.cost(), view.cautious_cost()
        if cost is None or cautious is None:
            cap = max(s.batch_size[0], min(s.batch_size[1], self.registered.batch_size))
            threads = now.threads if self._started else self._first_threads(view)
            seen = view.fit.mean()
            workers = now.workers
            why: dict[str, object] = {"start": True}
            if seen is not None:
                per_request = seen[1] / seen[0]
                budget = s.target_ms - view.margin_ms - SLACK_MS
                safe = max(2, batch_cap(Cost(0.0, per_request), budget, s.max_batch_delay_ms[0], s.batch_size,
                                        view.knobs.workers))  # fmt: skip
                cap = max(s.batch_size[0], min(cap, safe))
                guess: dict[str, object] = {"per_request_ms": round(per_request, 3), "safe_cap": safe}
                why = {"uncalibrated": guess}
                # with bounds.threads: a batch of one that misses the SLA at these threads asks for one more thread
                # at once (within the cores), as the law would; b need not be told for that
                if s.threads is not None and wait_factor(now.workers) * per_request > budget:
                    threads = self._threads(view, now.threads + 1, now.workers)
                # workers: as many as the load needs if a batch costs in proportion to its size (the pessimistic
                # guess, exact while batches are of one); up at once, never down before b is told
                guessed = self._guessed_workers(view, per_request, threads)
                if guessed > now.workers:
                    workers = guessed
                    guess["workers"] = guessed
            if self._started and cap >= now.batch_size:  # a smaller cap applies at once; never above the registered
                moved = replace(now, threads=threads, workers=workers)
                return Decision(moved, why) if moved != now else None
            self._started = True  # before any batch: the registered knobs within bounds, no delay
            first = Knobs(cap, float(s.max_batch_delay_ms[0]), workers, threads)
            return Decision(first, why) if first != now else None
        self._started = True
        # a backlog is load too: what waits should drain within a second
        rate = view.rate + view.queue
        costs, law = self._law(view, rate, cost, cautious)
        want = law.knobs
        why = {
            "law": law.to_json(),
            "a_ms": round(cost.a_ms, 3),
            "b_ms": round(cost.b_ms, 3),
            "b_cautious_ms": round(cautious.b_ms, 3),
            "largest": view.fit.largest,
            "margin_ms": round(view.margin_ms, 2),
        }
        if s.threads is not None:
            why["threads"] = {str(k): [round(c.cost.a_ms, 3), round(c.cost.b_ms, 3)] for k, c in costs.items()}
        # headroom: the workers DEADBAND more load would need are started now and held in reserve (below) until the
        # law's own count takes them: a forked worker serves within milliseconds, but the rate the law sees is the
        # last 0.5 s, and a climbing load outruns it (a trial climbing to 430 req/s in 2 s had its third worker asked
        # at 411 req/s, after full batches had waited 31-48 ms)
        _, higher = self._law(view, rate * (1.0 + DEADBAND), cost, cautious)
        if higher.knobs.workers > want.workers and higher.knobs.threads == want.threads:
            why["headroom"] = {"workers": higher.knobs.workers}
            want = replace(want, workers=higher.knobs.workers)
        # the tail checks the law: answers late past the SLA's share ask one worker more than the law, any late
        # answer holds the workers there are
        tail = self._tail_workers(view, want.workers)
        if tail != want.workers:
            late: dict[str, object] = {"late_share": round(view.late_share, 4), "workers": tail}
            if view.late_second > 0.0:
                late["late_second"] = round(view.late_second, 4)
            why["tail"] = late
            if tail > now.workers:  # the tail asked for one more than there are: remembered at this rate
                self._tail_rates[tail] = min(self._tail_rates.get(tail, math.inf), view.rate)
            want = replace(want, workers=tail)
        # ... and held while the rate stays within DEADBAND of the least rate it was needed at
        kept = max((w for w, r in self._tail_rates.items() if view.rate >= (1.0 - DEADBAND) * r), default=0)
        if kept > want.workers:
            why["tail_held"] = {"workers": kept, "rate": round(self._tail_rates[kept], 1)}
            want = replace(want, workers=min(kept, self._most_workers(view, view.knobs.threads)))
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
        # a count the workers went below is forgotten: the rate fell and stayed down (WORKERS_HOLD_S)
        self._tail_rates = {w: r for w, r in self._tail_rates.items() if w <= workers}
        threads = self._threads(view, want.threads, workers)
        budget = s.target_ms - view.margin_ms - SLACK_MS
        held = costs.get(threads) or ThreadCost(cost, cautious, measured_bounds(s.batch_size, view.fit.largest))
        cautious = held.cautious
        # the workers past the law's (the tail's, or held for WORKERS_HOLD_S) are held in reserve: they take a batch
        # only once its oldest request waited past the law's worst case, so the steady load keeps the law's batches
        reserve = workers - self._collecting(view, rate, cost, cautious, law.knobs.workers, workers)
        low = held.batch_bounds[0]
        if law.knobs.batch_size <= low or batching_gain(held.cost, law.knobs.batch_size, low) < GAIN_FLOOR:
            # the law's batches are of the least size, or larger ones carry under GAIN_FLOOR more: a worker held
            # back would keep no batch larger (or none worth it), and would only make requests wait, t(cap)/W
            # (resnet18 at 4x its batch of one: a worker into or out of reserve 28 times in 7.5 minutes, at rates of
            # 4-18 req/s, every batch of one either way; then, its cap kept at 2 by GAIN_KEPT, 10 times in the last
            # 130 s of the trace, each request behind a busy worker waiting up to a pair's 95 ms)
            reserve = 0
        if (workers, threads) != (want.workers, want.threads):  # workers or threads held: the cap those allow
            collecting = workers - reserve
            cap = batch_cap(cautious, budget, want.max_batch_delay_ms, held.batch_bounds, collecting)
            needed = batch_needed(held.cost, rate, collecting)
            cap = useful_cap(held.cost, cap, needed, held.batch_bounds[0], self._gain_floor(view))
            want = Knobs(cap, want.max_batch_delay_ms, workers, threads)
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
        # ... the load needs more, or would at DEADBAND more: a climbing rate reaches the cap with the workers busy
        # at RHO and their batches full, so the cap goes up before (a known-cost trial climbing to 290 req/s in
        # 1.5 s held cap 8 until the rate itself needed 9, while its full batches' oldest requests waited 27-48 ms)
        needed = batch_needed(held.cost, rate * (1.0 + DEADBAND), max(1, workers - reserve))
        urgent_up = needed is None or needed > now.batch_size or law.n_need > now.batch_size
        urgent_up = urgent_up or workers != now.workers or threads != now.threads or reserve != view.reserve
        worst_now = delay + wait_factor(workers - reserve) * cautious.t(now.batch_size)
        urgent_down = worst_now > s.target_ms - SLACK_MS
        batch = self._cap(view.now, now.batch_size, want.batch_size, urgent_up, urgent_down)
        if batch < now.batch_size:  # why the cap came down: a sure miss at once, or the law's ask held for HOLD_S
            why["cap_down"] = {"sure_miss": urgent_down, "worst_ms": round(worst_now, 2), "asked_s": self._cap_held}
        chosen = Knobs(batch, delay, workers, threads)
        if reserve:
            why["reserve"] = reserve
        return Decision(chosen, why, reserve) if chosen != now or reserve != view.reserve else None

    def _collecting(self, view: View, rate: float, cost: Cost, cautious: Cost, law_workers: int, workers: int) -> int:
        """Of ``workers``, how many collect batches (the rest are held in reserve): the law's count, more at once;
        fewer only once the law has asked for fewer for HOLD_S without a break, and would even at DEADBAND more load
        (a rate that wobbles about the line between two counts must not move the cap back and forth with them)."""
        now = max(1, view.knobs.workers - view.reserve)
        if law_workers >= now:
            self._fewer_collect_since = None
            return min(workers, law_workers)
        _, higher = self._law(view, rate * (1.0 + DEADBAND), cost, cautious)
        fewer = max(law_workers, higher.knobs.workers)
        if fewer >= now:
            self._fewer_collect_since = None
            return min(workers, now)
        since = self._fewer_collect_since = (
            self._fewer_collect_since if self._fewer_collect_since is not None else view.now
        )
        if view.now - since >= HOLD_S:
            self._fewer_collect_since = None
            return min(workers, fewer)
        return min(workers, now)

    def _law(self, view: View, rate: float, cost: Cost, cautious: Cost) -> tuple[dict[int, ThreadCost], LawResult]:
        """The law's knobs, and what it knew of each thread count it weighed (only the threads now, unless the
        policy moves them)."""
        s = self.settings
        floor = self._gain_floor(view)
        if s.threads is None:
            bounds = measured_bounds(s.batch_size, view.fit.largest)
            law = decide(
                cost, rate, s.target_ms, view.margin_ms, bounds, s.max_batch_delay_ms, view.workers_bounds, cautious,
                floor,
            )  # fmt: skip
            return {view.knobs.threads: ThreadCost(cost, cautious, bounds)}, law
        costs = {k: c for k in range(s.threads[0], s.threads[1] + 1) if (c := view.thread_cost(k)) is not None}
        if not costs:  # none within bounds can be told or guessed: the threads now, as measured
            costs = {view.knobs.threads: ThreadCost(cost, cautious, measured_bounds(s.batch_size, view.fit.largest))}
        law = decide_threads(
            costs, rate, s.target_ms, view.margin_ms, s.max_batch_delay_ms, view.workers_bounds, view.cores, floor
        )
        return costs, law

    def _gain_floor(self, view: View) -> float:
        """What batching must gain to be worth it (``law.useful_cap``): GAIN_FLOOR to start batching, GAIN_KEPT to
        stop once the cap is above the bounds' least. resnet18 on a CPU core gains 9-14% in batches of 2-4 (the
        fit's estimate moves with every batch): with one floor its cap went between 1 and 3 28 times in 7.5
        minutes."""
        return GAIN_KEPT if view.knobs.batch_size > self.settings.batch_size[0] else GAIN_FLOOR

    def _tail_workers(self, view: View, law_workers: int) -> int:
        """The law's workers checked against what came late lately (``view.late_share``, since the workers last
        changed): more than the SLA's share late (TAIL_SHARE: its percentile missed) asks one worker more than there
        are, within bounds (and the cores, at the threads now, when threads are moved), as does a second with 100
        answers or more past that share; any late answer keeps the workers there are. The law's worst case takes the
        workers' batches as staggered; Poisson bursts at ρ = 0.8 queue past it, and only the answers show by how
        much."""
        share, now = view.late_share, view.knobs.workers
        allowed = TAIL_SHARE.get(self.settings.target)
        if share <= 0.0 or allowed is None:
            return law_workers
        wanted = now + 1 if max(share, view.late_second) > allowed else now
        return max(law_workers, min(self._most_workers(view, view.knobs.threads), wanted))

    def _guessed_workers(self, view: View, per_request_ms: float, threads: int) -> int:
        """Before b is told: the fewest workers within bounds (and the cores, at ``threads`` each when threads are
        moved) that keep each under RHO busy if every request costs ``per_request_ms`` alone (no batching gain)."""
        low = view.workers_bounds[0]
        rate = view.rate + view.queue  # a backlog is load too, as the law has it
        need = math.ceil(rate * per_request_ms / 1000.0 / RHO - 1e-9) if per_request_ms > 0 else low
        return max(low, min(self._most_workers(view, threads), need))

    def _most_workers(self, view: View, threads: int) -> int:
        """The bounds' most workers, and when threads are moved no more than the cores hold at ``threads`` each."""
        low, high = view.workers_bounds
        if self.settings.threads is not None and view.cores:
            high = max(low, min(high, view.cores // max(1, threads)))
        return high

    def _first_threads(self, view: View) -> int:
        """Before the fit tells b: the threads now, within bounds and the cores the workers now may share."""
        bounds, now = self.settings.threads, view.knobs
        if bounds is None:
            return now.threads
        fit_cores = max(1, view.cores // max(1, now.workers)) if view.cores else bounds[1]
        return max(bounds[0], min(bounds[1], now.threads or 1, fit_cores))

    def _threads(self, view: View, want: int, workers: int) -> int:
        """Threads per worker after hysteresis: more at once (as far as the cores hold them beside ``workers``),
        fewer after HOLD_S, or at once when the workers would not fit the cores otherwise."""
        bounds, now = self.settings.threads, view.knobs
        if bounds is None:
            return now.threads
        room = max(bounds[0], view.cores // max(1, workers)) if view.cores else bounds[1]
        threads = now.threads
        if want > threads:
            threads, self._fewer_threads_since = min(want, room), None
        elif want < threads:
            since = self._fewer_threads_since
            self._fewer_threads_since = since = since if since is not None else view.now
            if view.now - since >= HOLD_S:
                threads, self._fewer_threads_since = want, None
        else:
            self._fewer_threads_since = None
        if threads > room:  # more workers than the cores hold at these threads: fewer threads now
            threads = room
        return max(bounds[0], min(bounds[1], threads))

    def _cap(self, now: float, cap: int, want: int, urgent_up: bool, urgent_down: bool) -> int:
        """The batch cap after hysteresis: ``want`` at once when urgent in its direction; else only once the law
        has asked for a cap on the same side of ``cap`` (past the deadband) for HOLD_S, the least change asked."""
        if not _far(want, cap, 1.0):
            self._cap_since = None
            return cap
        up = want > cap
        if (up and urgent_up) or (not up and urgent_down):
            self._cap_since, self._cap_held = None, 0.0
            return want
        if self._cap_since is None or self._cap_up != up:
            self._cap_since, self._cap_up, self._cap_asked = now, up, want
        else:
            self._cap_asked = min(self._cap_asked, want) if up else max(self._cap_asked, want)
        if now - self._cap_since >= HOLD_S:
            self._cap_held = round(now - self._cap_since, 2)
            self._cap_since = None
            return self._cap_asked
        return cap


def _far(new: float, old: float, floor: float) -> bool:
    """Differs by more than the deadband (relative) and more than ``floor`` (absolute)."""
    return abs(new - old) > max(floor - 1e-9, DEADBAND * abs(old))


__all__ = ["DEADBAND", "HOLD_S", "TAIL_SHARE", "WORKERS_HOLD_S", "SloPolicy"]
