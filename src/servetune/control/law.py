"""The control law, as pure functions of what was measured: the model's cost t(n) = a + b·n per batch of n (one
worker, its threads), the arrival rate λ, the SLA's latency L and the knobs' bounds. docs/controller.md derives it.

1. **Batch cap** n_cap: the largest batch within bounds whose worst case fits the SLA: a request may find every
   worker busy with a full batch, wait for the first to free (under load greedy dispatch staggers the W workers'
   batches: within t(n)/W), wait out the batch delay d, then run in its own batch:
   ``d + (1 + 1/W)·t(n_cap) <= L - m`` (m: the predictions' error margin plus the frontend's slack). Unless
   batching pays (:func:`useful_cap`): when batches of n_cap carry under ``GAIN_FLOOR`` more per second than
   batches of the bounds' least (a batch that costs in proportion to its size, as a CNN on a CPU core), the cap is
   the batch the load needs and no larger: a larger batch would only make its first requests wait for the last.
   Batching already on stays on down to ``GAIN_KEPT`` (the policy passes the floor: a deadband).
2. **Workers** W: the fewest within bounds whose capacity at their cap keeps each worker busy at most ρ = 0.8 of the
   time: ``W·n_cap(W) / t(n_cap(W)) >= λ / ρ``, each W at its own cap (more workers wait less for one to free, so
   their cap is larger).
3. **Delay** d: its lower bound. Waiting never shortens a request's latency, and with workers that do not share a
   resource it does not raise capacity either: while the workers are busy the queue forms the batch the load needs
   by itself (greedy dispatch settles where (λ/W)·t(n) = n), and the cap bounds it. What the load needs,
   n_need = the smallest batch with ``(λ/W)·t(n) <= ρ·n``, decides whether the knobs can hold the load at all
   (``feasible``: n_need <= n_cap).

What the fit can tell: the law sizes the cap on the fit's cautious cost (b at its upper confidence bound,
``ServiceFit.cautious``) and never past ``EXTRAPOLATE`` times the largest batch measured (:func:`measured_bounds`):
a fit from batches of one and two tells b poorly, and a b underestimated would put the cap at its bound.

4. **Threads** per worker (with ``bounds.threads``; :func:`decide_threads`): each thread count k has its own cost
   t_k(n), and at most ``cores // k`` workers (the cores the other models leave). For each k the law above runs; the
   knobs that hold the load inside the SLA with the fewest cores (W·k) win, the fewer threads on a tie (threads
   rarely scale in full, so fewer buy more per core). More threads are chosen only when fewer cannot hold the SLA
   or the load within the cores: a model whose batch of one at one thread is slower than the SLA allows, or a load
   that one-thread workers cannot carry on the cores there are. A thread count not yet measured is guessed from one
   that was (:func:`rescaled`): more threads speed a batch up by only the square root of the ratio, fewer slow it in
   full proportion, cautious both ways until its own batches tell.

Admission (:func:`completion_ms`): a request's completion is predicted from the requests ahead of it, the workers'
running batches and t(n) of its own batch, filled by the arrivals until a worker takes it; a request predicted to
finish after its deadline is shed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from servetune.control.settings import Knobs

RHO = 0.8  # the busy share per worker the law keeps under: headroom for bursts and the fit's error
SLACK_MS = 2.0  # the host's scheduling and the frontend's own time, per request
EXTRAPOLATE = 2  # the cap stays within this many times the largest batch measured, until larger ones are seen
GAIN_FLOOR = 0.10  # batches that carry less than this much more per second than the smallest are not worth the wait
GAIN_KEPT = 0.05  # ... once batching is on, it stays on down to this: a gain fitted near the floor must not flip it


@dataclass(frozen=True)
class Cost:
    """A batch of n takes ``a_ms + b_ms * n`` on one worker."""

    a_ms: float
    b_ms: float

    def t(self, n: float) -> float:
        return self.a_ms + self.b_ms * n

    def scaled(self, factor: float) -> Cost:
        """Every batch ``factor`` times as long."""
        return Cost(self.a_ms * factor, self.b_ms * factor)


@dataclass(frozen=True)
class LawResult:
    """The knobs the law chose, and the figures behind them (the decision log records these)."""

    knobs: Knobs
    rate: float
    n_need: int
    utilization: float  # each worker's predicted busy share at these knobs
    worst_ms: float  # the predicted worst latency: d + (1 + 1/W)·t(n_cap)
    feasible: bool  # False: even the bounds' most cannot hold the SLA at this load (the best effort is chosen)

    def to_json(self) -> dict[str, object]:
        return {
            "rate": round(self.rate, 1),
            "n_need": self.n_need,
            "utilization": round(self.utilization, 3),
            "worst_ms": round(self.worst_ms, 2),
            "feasible": self.feasible,
        }


def wait_factor(workers: int) -> float:
    """A request's worst case in batch times: its own batch, after the first of ``workers`` workers frees. Under
    load, greedy dispatch staggers the workers' batches, so the first frees within t(n)/W: 1 + 1/W."""
    return 1.0 + 1.0 / max(1, workers)


def batch_cap(cost: Cost, budget_ms: float, delay_ms: float, bounds: tuple[int, int], workers: int = 1) -> int:
    """The largest n in ``bounds`` with ``delay + (1 + 1/W)·t(n) <= budget`` (the bounds' low end when none fits)."""
    room = (budget_ms - delay_ms) / wait_factor(workers) - cost.a_ms
    if cost.b_ms <= 0:
        return bounds[1] if room >= 0 else bounds[0]
    n = math.floor(room / cost.b_ms + 1e-9)
    return max(bounds[0], min(bounds[1], n))


def measured_bounds(bounds: tuple[int, int], largest: int) -> tuple[int, int]:
    """The batch-size bounds narrowed to what the fit has measured: at most ``EXTRAPOLATE`` times the largest batch
    seen (never under the bounds' low end). Under load, full batches at the cap are seen and the cap doubles from
    tick to tick up to what the SLA allows; at low load it stays near the batches that form."""
    low, high = bounds
    return low, max(low, min(high, EXTRAPOLATE * max(1, largest)))


def batch_needed(cost: Cost, rate: float, workers: int, rho: float = RHO) -> int | None:
    """The smallest n with ``(rate / workers)·t(n) <= rho·n``; None when no batch size is enough."""
    per_worker = rate / workers / 1000.0  # requests per ms
    if per_worker <= 0:
        return 1
    room = rho - per_worker * cost.b_ms
    if room <= 0:
        return None
    return max(1, math.ceil(per_worker * cost.a_ms / room - 1e-9))


def batching_gain(cost: Cost, n: int, low: int = 1) -> float:
    """How much more a worker carries per second in batches of ``n`` than in batches of ``low``: 0.1 is 10% more."""
    t_n, t_low = cost.t(n), cost.t(low)
    if t_n <= 0 or t_low <= 0 or low < 1:
        return math.inf
    return (n / t_n) / (low / t_low) - 1.0


def useful_cap(cost: Cost, n_cap: int, needed: int | None, low: int, floor: float = GAIN_FLOOR) -> int:
    """``n_cap``, unless batches of it carry under ``GAIN_FLOOR`` more per second than batches of ``low`` (the
    bounds' least): then the batch the load needs (``needed``), ``low`` when none up to the cap is enough. Batching
    that buys no capacity buys only latency: a batch of two of a model whose batch costs twice a batch of one makes
    the first request wait for the second and serves the second no sooner (resnet18 on a CPU core: t(n) = 1.6 +
    42.5n ms, 1.8% more per second in pairs, and a pair's worst case 64 ms longer). ``floor``: ``GAIN_KEPT`` where
    batching is on already (the policy's hysteresis)."""
    if n_cap <= low or batching_gain(cost, n_cap, low) >= floor:
        return n_cap
    if needed is None or needed > n_cap:
        return low
    return max(low, needed)


def decide(
    cost: Cost,
    rate: float,
    target_ms: float,
    margin_ms: float,
    batch_bounds: tuple[int, int],
    delay_bounds: tuple[int, int],
    worker_bounds: tuple[int, int],
    cap_cost: Cost | None = None,
    gain_floor: float = GAIN_FLOOR,
) -> LawResult:
    """The law's knobs for this cost, rate and SLA (see the module). ``worker_bounds`` = (W, W) holds workers.
    ``cap_cost`` (the fit's cautious cost; default ``cost``) sizes the cap and its worst case: the cap bounds the
    worst latency, so it takes the pessimistic line, while the workers and the batch the load needs take the fit.
    ``gain_floor``: what batching must gain to be worth it (:func:`useful_cap`)."""
    capped = cap_cost or cost
    budget = target_ms - margin_ms - SLACK_MS
    delay = float(delay_bounds[0])
    # 2. workers: the fewest that carry the load under rho, each count at its own cap (more workers wait less for
    # one to free, so each may take a larger batch); the bounds' most when none does
    workers = worker_bounds[1]
    for w in range(worker_bounds[0], worker_bounds[1] + 1):
        n = useful_cap(cost, batch_cap(capped, budget, delay, batch_bounds, w), batch_needed(cost, rate, w),
                       batch_bounds[0], gain_floor)  # fmt: skip
        if w * n / cost.t(n) * 1000.0 * RHO >= rate - 1e-9:
            workers = w
            break
    n_fits = batch_cap(capped, budget, delay, batch_bounds, workers)
    # 3. the delay: its lower bound; the batch the load needs tells whether these knobs hold the load at all
    needed = batch_needed(cost, rate, workers)
    feasible = needed is not None and needed <= n_fits
    n_cap = useful_cap(cost, n_fits, needed, batch_bounds[0], gain_floor)
    n_need = min(needed, n_cap) if needed is not None else n_cap
    utilization = rate / workers / 1000.0 * cost.t(n_need) / n_need
    worst = delay + wait_factor(workers) * capped.t(n_cap)
    return LawResult(Knobs(n_cap, delay, workers), rate, n_need, utilization, worst, feasible)


def rescaled(cost: Cost, measured_threads: int, threads: int) -> Cost:
    """``cost``, measured at ``measured_threads`` per worker, guessed at ``threads``: more threads are taken to speed
    a batch up by the square root of the ratio only (2 threads: 1.41x, where 2x is ideal and rare), fewer to slow it
    down in full proportion (2 -> 1: 2x): the guess errs on the slow side either way."""
    if threads == measured_threads or measured_threads < 1 or threads < 1:
        return cost
    ratio = measured_threads / threads
    return cost.scaled(ratio if threads < measured_threads else math.sqrt(ratio))


@dataclass(frozen=True)
class ThreadCost:
    """What the law knows of one thread count: the fitted cost, its cautious line, the batch bounds the fit can
    vouch for (``measured_bounds``)."""

    cost: Cost
    cautious: Cost
    batch_bounds: tuple[int, int]


def decide_threads(
    costs: dict[int, ThreadCost],
    rate: float,
    target_ms: float,
    margin_ms: float,
    delay_bounds: tuple[int, int],
    worker_bounds: tuple[int, int],
    cores: int,
    gain_floor: float = GAIN_FLOOR,
) -> LawResult:
    """The law over thread counts too (the module's point 4): ``costs`` maps each thread count to consider to what is
    known of it; at most ``cores // k`` workers at k threads (never under ``worker_bounds``' low end, which the
    placement then refuses or the host oversubscribes). The knobs that hold the load inside the SLA with the fewest
    cores win, the fewer threads on a tie; when none does, those with the most capacity whose worst case fits the
    SLA, else those with the smallest worst case."""
    budget = target_ms - margin_ms - SLACK_MS
    best: tuple[tuple[float, ...], LawResult] | None = None
    fewest = min(costs, default=0)
    for k in sorted(costs):
        if cores // k < worker_bounds[0] and k != fewest:  # the fewest workers allowed would not fit the cores
            continue
        known = costs[k]
        high = max(worker_bounds[0], min(worker_bounds[1], cores // k))
        law = decide(
            known.cost, rate, target_ms, margin_ms, known.batch_bounds, delay_bounds, (worker_bounds[0], high),
            known.cautious, gain_floor,
        )  # fmt: skip
        knobs = Knobs(law.knobs.batch_size, law.knobs.max_batch_delay_ms, law.knobs.workers, k)
        law = replace(law, knobs=knobs)
        fits = law.worst_ms <= budget + 1e-9
        capacity = knobs.workers * knobs.batch_size / known.cost.t(knobs.batch_size) * 1000.0
        if law.feasible and fits:
            rank: tuple[float, ...] = (0.0, knobs.workers * k, k)
        elif fits:
            rank = (1.0, -capacity, k)
        else:
            rank = (2.0, law.worst_ms, k)
        if best is None or rank < best[0]:
            best = (rank, law)
    if best is None:
        raise ValueError("decide_threads: no thread count to consider")
    return best[1]


def completion_ms(
    cost: Cost,
    ahead: int,
    batch_size: int,
    busy_remaining_ms: list[float],
    workers: int,
    delay_ms: float = 0.0,
    arrival_rate: float = 0.0,
) -> float:
    """Milliseconds from now until a request arriving now is answered: ``ahead`` requests queue before it, served
    ``batch_size`` at a time by ``workers`` workers, of which those in ``busy_remaining_ms`` are busy for that long
    yet; its own batch takes t(its size). With no request ahead and an idle worker it waits the batch delay.

    Its own batch is the requests left over after the full batches ahead, it, and those that arrive (at
    ``arrival_rate`` per second) until a worker takes the batch, up to ``batch_size``: a request that waits for a
    worker rides in a batch that later requests fill, and a fuller batch takes longer (resnet18 in an overload at
    1.5x: batches of 6 at 225 ms where its own share, t(3), was 121 ms, so half the answers admitted were late)."""
    workers = max(1, workers)
    full, rest = divmod(ahead, batch_size)  # whole batches ahead of it
    own = min(batch_size, rest + 1)
    if full == 0:  # the common case, admission's hot path: it goes when the first worker frees
        start = 0.0 if len(busy_remaining_ms) < workers else max(0.0, min(busy_remaining_ms))
    else:
        free = sorted([max(0.0, r) for r in busy_remaining_ms] + [0.0] * max(0, workers - len(busy_remaining_ms)))
        free = free[:workers]
        t_full = cost.t(batch_size)
        if full <= 4 * workers:
            for _ in range(full):
                free[0] += t_full
                free.sort()
            start = free[0]
        else:  # a long queue: the workers take it in turns
            start = free[0] + full * t_full / workers
    if ahead == 0 and start == 0.0:
        start = delay_ms if own < batch_size else 0.0
    elif start > 0.0:
        own = min(batch_size, own + int(arrival_rate * start / 1000.0))
    return start + cost.t(own)


__all__ = [
    "RHO",
    "EXTRAPOLATE",
    "SLACK_MS",
    "Cost",
    "LawResult",
    "GAIN_FLOOR",
    "GAIN_KEPT",
    "batch_cap",
    "batch_needed",
    "batching_gain",
    "useful_cap",
    "ThreadCost",
    "completion_ms",
    "decide",
    "decide_threads",
    "measured_bounds",
    "rescaled",
    "wait_factor",
]
