"""Before a winner is named: the finalists measured again, interleaved, and compared pairwise with a confidence
interval; when the data cannot tell two apart, the simpler (cheaper) one is chosen.

A search measures each config once or twice, minutes apart, on a machine whose speed drifts: two configs closer
than that drift are ranked by chance. So, once the search is over:

1. **Finalists**: the best config meeting the SLA and, of the others within 10% of its objective, the simplest
   (``count`` in all, default 2), chosen from the search's own trials. Not the next best: configs that close were
   ranked by the machine's drift, and which of them came second changes from run to run, while the simplest in the
   band is the same each time; the rounds then keep it unless the best beats it clearly. Then the best's **simpler
   neighbours** (one knob one step down: a worker fewer, the next smaller batch, ...) that the search did not rule
   out (measured missing the SLA or more than 25% behind, in a run nothing else disturbed): whether a search
   happened to measure one, and where within 25% it ranked, is the search path and the drift (a resnet18 study
   named 2 workers x batch 4 without comparing batch 2 in the runs where batch 2 came 11-13% behind or was never
   measured, and found the two indistinguishable in every run where it compared them). They come on top of
   ``count``: a config is named only once it beat, on interleaved rounds, each config one step simpler that could
   still be as good.
2. **Interleaved rounds**: each finalist is measured ``rounds`` more times (default 3), in turn: A, B, A, B, ...
   so that drift in the machine hits all of them alike. When the rounds' best is not the search's best, its own
   simpler neighbours were never compared with it: a **second set** of rounds measures it again with them, in
   turns (a resnet18 run's search named 3 x 4, the rounds found 2 x 4 ahead, and 2 x 2, which every other run
   found indistinguishable from 2 x 4, was never measured against it).
3. **Pairwise comparison**: round by round (each round of the other paired with the best's nearest in time, so
   that a second set's rounds pair with each other), the objective of the best finalist over each other one; the mean of
   the log-ratios with Student's t at 95% gives the interval: "2 workers x batch 1 beats 1 worker x batch 2 by 14%
   (95% CI 9-19%)". An interval that holds 1 says the two are **indistinguishable at this noise level**: of those
   within 10% of the best on the rounds' mean, the simplest is chosen (fewest workers, then the smallest batch,
   delay and threads: the cheapest to run, and the one with the least latency at stake). One further behind is not
   chosen on noise.

Only the rounds' own figures enter the comparison (the search's earlier runs were not interleaved); a finalist
whose rounds miss the SLA on their mean is out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass

from servetune.bench.stats import mean_interval
from servetune.tune.space import Space
from servetune.tune.strategies.base import Proposal, contended
from servetune.tune.study import Point, Study
from servetune.tune.trial import Summary, Trial, average, judge, summarise_all

BAND = 0.9  # finalists: within 10% of the best objective
NEIGHBOUR_BAND = 0.75  # the best's simpler neighbours: unless measured more than 25% behind
PHASE = "finalist"
SECOND = "finalist-2"  # the second set of rounds: the first rounds' best and its simpler neighbours
FINAL_PHASES = (PHASE, SECOND)
CONTROLLER = "controller"  # after the winner: it against the online controller on the trace (``online.py``)


def choose_finalists(study: Study, trials: Sequence[Trial], in_space: Sequence[Point] | None = None) -> list[Point]:
    """The configs to compare: the best meeting the SLA and the simplest others within ``BAND`` of it, from the
    search's trials (the finalists' own rounds left out, so that a resumed study picks the same ones)."""
    count = study.strategy.finalists
    if count < 2:
        return []
    summaries = summarise_all(_searched(trials), study)
    passed = [s for s in summaries if s.verdict.passed]
    if in_space is not None:
        passed = [s for s in passed if s.config in in_space]
    if len(passed) < 2:
        return []
    best, floor = passed[0], BAND * passed[0].verdict.objective
    near = [s for s in passed[1:] if s.verdict.objective >= floor]
    near.sort(key=lambda s: (simplicity(s.config), -s.verdict.objective))
    chosen = [best.config, *(s.config for s in near[: count - 1])]
    measured = {s.config: s for s in summaries}
    allowed = set(in_space if in_space is not None else measured)
    chosen += [p for p in simpler_neighbours(study, best.config, measured) if p in allowed and p not in chosen]
    return chosen


def _searched(trials: Sequence[Trial]) -> list[Trial]:
    """The search's own trials: the finalists' rounds (and the online controller's, which come after) left out."""
    return [t for t in trials if t.phase not in (*FINAL_PHASES, CONTROLLER)]


def second_finalists(
    study: Study, trials: Sequence[Trial], first: Sequence[Point], in_space: Sequence[Point] | None = None
) -> list[Point]:
    """Once the first set's rounds are all measured: when their best is not the search's best (``first[0]``), that
    config and its simpler neighbours that are not finalists yet (``[best, *neighbours]``, to measure in a second
    set of interleaved rounds); [] otherwise."""
    rounds = study.strategy.rounds
    if len(first) < 2 or any(sum(t.config == c and t.phase == PHASE for t in trials) < rounds for c in first):
        return []
    verdict = compare(study, [t for t in trials if t.phase != SECOND], first)
    if verdict is None or verdict.best is None or verdict.best == first[0]:
        return []
    measured = {s.config: s for s in summarise_all(_searched(trials), study)}
    if verdict.best not in measured:
        return []
    allowed = set(in_space if in_space is not None else measured)
    extra = [p for p in simpler_neighbours(study, verdict.best, measured) if p in allowed and p not in first]
    return [verdict.best, *extra] if extra else []


def all_finalists(study: Study, trials: Sequence[Trial], in_space: Sequence[Point] | None = None) -> list[Point]:
    """Every config compared before the winner is named: the first set, then the second set's new ones."""
    first = choose_finalists(study, trials, in_space)
    return first + [p for p in second_finalists(study, trials, first, in_space) if p not in first]


def simpler_neighbours(study: Study, best: Point, measured: Mapping[Point, Summary]) -> list[Point]:
    """The configs one knob one step below ``best`` (``Space.step``; not down to automatic threads: that is as many
    as the worker's share of cores, not fewer), least simple first, but those the search measured missing the SLA or
    more than ``NEIGHBOUR_BAND`` behind the best's objective in a run nothing else disturbed."""
    space, floor = Space(study), NEIGHBOUR_BAND * measured[best].verdict.objective
    below = [
        p
        for i, knob in space.axes(best)
        if (p := space.step(best, (i, knob), -1)) is not None and not (knob == "threads" and p.parts[i].threads == 0)
    ]
    fit = [p for p in below if p not in measured or not _ruled_out(measured[p], floor)]
    return sorted(fit, key=simplicity, reverse=True)


def _ruled_out(summary: Summary, floor: float) -> bool:
    """Measured missing the SLA or under ``floor``, in a run that other processes did not disturb (a contended
    run's figures may be theirs: a hog run measured 2 x 2 at 0.65 of 2 x 4 with 0.63 cores of others)."""
    if contended(summary):
        return False
    return not summary.verdict.passed or summary.verdict.objective < floor


def plan(
    study: Study, finalists: Sequence[Point], trials: list[Trial], phase: str = PHASE
) -> Generator[Proposal, None, None]:
    """The interleaved rounds (A, B, A, B, ...) of one set (``phase``); ``trials`` is read after each yield for the
    repeat numbers."""
    rounds = study.strategy.rounds
    label = "finalist round" if phase == PHASE else "second finalist round"
    for r in range(rounds):
        for config in finalists:
            done = sum(1 for t in trials if t.config == config and t.phase == phase)
            if done > r:
                continue  # measured already (a resumed study)
            repeat = sum(1 for t in trials if t.config == config)
            yield Proposal(config, repeat, f"{label} {r + 1} of {rounds}", phase=phase)


def simplicity(point: Point) -> tuple[int, ...]:
    """Smaller is simpler and cheaper: workers (and the cores their threads take), batch size, delay, pinning."""
    parts = point.parts
    return (
        sum(p.workers * max(1, p.threads) for p in parts),
        sum(p.workers for p in parts),
        sum(p.batch_size for p in parts),
        sum(p.batch_delay_ms for p in parts),
        sum(p.inter_op_threads for p in parts),
        sum(int(p.pinning) for p in parts),
    )


@dataclass(frozen=True)
class Comparison:
    """``best`` against ``other`` over the interleaved rounds: the ratio of their objectives (mean of the rounds'
    log-ratios) with its 95% interval; ``distinguishable`` when the interval excludes 1."""

    best: Point
    other: Point
    rounds: int
    ratio: float
    low: float | None
    high: float | None

    @property
    def distinguishable(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 1.0 or self.high < 1.0)

    @property
    def tied(self) -> bool:
        """Indistinguishable, and within the finalists' band on the rounds' mean: the simpler one may be chosen. An
        interval too wide to tell them apart says nothing either way: a hog run's rounds put 2 workers x batch 4 at
        1.61x 1 worker x batch 4 (95% CI -14-201%), and the simpler was chosen, a third of the throughput lost on
        noise."""
        return not self.distinguishable and self.ratio <= 1.0 / BAND


@dataclass(frozen=True)
class Verdict:
    """What the rounds say: each comparison, the config chosen, and why."""

    finalists: tuple[Point, ...]
    comparisons: tuple[Comparison, ...]
    chosen: Point | None
    reason: str
    best: Point | None = None  # the best on the rounds (``chosen`` unless a simpler one ties with it)


def objective_of(study: Study, trial: Trial) -> float | None:
    figures = trial.figures()
    if figures is None:
        return None
    if study.is_app:
        return figures.throughput_rps
    return study.objective.value(figures.throughput_rps, study.family(trial.config.parts[0].family).device)


def compare(study: Study, trials: Sequence[Trial], finalists: Sequence[Point]) -> Verdict | None:
    """The verdict of the finalists' rounds (None before any round was measured)."""
    rounds = {c: [t for t in trials if t.config == c and t.phase in FINAL_PHASES] for c in finalists}
    if sum(len(r) for r in rounds.values()) == 0:
        return None
    summaries: dict[Point, Summary] = {}
    for config, own in rounds.items():
        measured = [f for t in own if (f := t.figures()) is not None]
        if measured:
            figures = average(measured)
            summaries[config] = Summary(config, tuple(own), figures, judge(figures, config, study), 0, 0)
    passing = [c for c in finalists if c in summaries and summaries[c].verdict.passed]
    if not passing:
        return Verdict(tuple(finalists), (), None, "no finalist met the SLA on its interleaved rounds")
    best = max(passing, key=lambda c: summaries[c].verdict.objective)
    comparisons = []
    for other in passing:
        if other == best:
            continue
        pairs = [
            (a, b)
            for ta, tb in paired(rounds[best], rounds[other])
            if (a := objective_of(study, ta)) and (b := objective_of(study, tb))
        ]
        logs = [math.log(a / b) for a, b in pairs]
        interval = mean_interval(logs)
        ratio = math.exp(sum(logs) / len(logs)) if logs else math.nan
        low, high = (math.exp(interval[1]), math.exp(interval[2])) if interval else (None, None)
        comparisons.append(Comparison(best, other, len(pairs), ratio, low, high))
    ties = [best] + [c.other for c in comparisons if c.tied]
    chosen = min(ties, key=lambda c: (simplicity(c), -summaries[c].verdict.objective))
    if chosen == best:
        reason = "the best finalist on the interleaved rounds" + (
            ", and the simplest of those it cannot be told from" if len(ties) > 1 else ""
        )
        if any(not c.distinguishable and not c.tied for c in comparisons):
            reason += (
                f"; a simpler one it could not be told from at this noise level measured more than "
                f"{100 * (1 / BAND - 1):.0f}% behind on the rounds: not chosen on noise"
            )
    else:
        reason = "indistinguishable at this noise level from the best finalist: the simpler (cheaper) one is chosen"
    return Verdict(tuple(finalists), tuple(comparisons), chosen, reason, best)


def paired(best: Sequence[Trial], other: Sequence[Trial]) -> list[tuple[Trial, Trial]]:
    """Each round of ``other`` with the round of ``best`` measured nearest it (each used once): the rounds were
    interleaved, so the pairs share the machine's state; a second set's rounds pair with each other."""
    free, pairs = list(best), []
    for trial in sorted(other, key=lambda t: t.index):
        if not free:
            break
        nearest = min(free, key=lambda t: (abs(t.index - trial.index), t.index))
        free.remove(nearest)
        pairs.append((nearest, trial))
    return pairs


def sentence(comparison: Comparison, describe: Callable[[Point], str]) -> str:
    """One comparison for people; ``describe`` names a config."""
    best, other = describe(comparison.best), describe(comparison.other)
    rounds = f"{comparison.rounds} interleaved round{'s' if comparison.rounds != 1 else ''}"
    if comparison.low is None or comparison.high is None:
        return f"{best} against {other}: ratio {comparison.ratio:.3f} over {rounds} (too few for an interval)"
    pct = f"95% CI {100 * (comparison.low - 1):.0f}–{100 * (comparison.high - 1):.0f}%"
    if comparison.distinguishable:
        return f"{best} beats {other} by {100 * (comparison.ratio - 1):.0f}% ({pct}, {rounds})"
    return (
        f"{best} and {other} are indistinguishable at this noise level (ratio {comparison.ratio:.3f}, {pct}, {rounds})"
    )
