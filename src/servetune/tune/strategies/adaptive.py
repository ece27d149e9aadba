"""``adaptive``: ladders, then a hill climb, pruning what cannot win, then a re-measure of the top candidates.

1. From the default config (1 worker, batch 1) of the first family, raise the batch size while the score rises,
   then the workers at the best batch size while it rises ("more workers stop when throughput stops rising"), then
   the threads when they are searched; a ladder stops after two steps in a row that do not rise, or one that misses
   the SLA. An app walks instead from its default config to the first neighbour that beats it (the most promising
   first: see ``_bottleneck_climb``), and stops where none does.
2. Measure every other family (optimization x device) at the best knobs so far.
3. Climb: measure the unmeasured neighbours of the best config (one step on each knob, the two anti-diagonals,
   the other families); move to the best; stop when no neighbour beats it by more than noise (``RISE``). Before a
   move, the best and the challenger are measured a second time, and the move is taken only if it still wins on
   the averages: a move costs a wave of trials, one lucky run should not buy it. After a move, a step that
   clearly lost from the previous centre is not tried from the new one.
4. Re-measure the top candidates (those not already measured twice).

Pruned without measuring: a larger batch at the same family, workers and delay as a config whose median request
already missed a latency limit (a tail miss may be noise, so it is measured; when the load makes the rule a sure
thing, see ``Load.batch_monotone``), configs of a family whose workers could not be started, and what the server's
own timing says cannot win (``bounds.py``: the fitted batch curves, the host's parallelism, full batches).

The score of a config is its objective when it meets the SLA and minus its relative miss otherwise, so the same
walk finds the closest config when none meets the SLA.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator

from servetune.tune.space import Axis, Space, cheap_order
from servetune.tune.strategies.base import Plan, Proposal, Strategy
from servetune.tune.strategies.bounds import Bounds
from servetune.tune.study import Config, Point, Study
from servetune.tune.trial import Trial, Verdict

RISE = 0.02  # a score must beat the previous one by this fraction to count as rising (noise)
Walk = Generator[Proposal, None, Point]


def better(a: Verdict, b: Verdict) -> bool:
    """``a`` beats ``b`` by more than noise."""
    if math.isinf(b.score):
        return not math.isinf(a.score)
    return a.score > b.score + RISE * abs(b.score)


class AdaptiveSearch(Strategy):
    name = "adaptive"

    def __init__(self, space: Space, study: Study) -> None:
        super().__init__(space, study)
        self.bounds = Bounds(study)
        load = study.families[0].load
        self._batches_fill = load.mode == "concurrency" and load.concurrency is None

    def observe(self, trial: Trial) -> None:
        super().observe(trial)
        self.bounds.learn(self.trials)

    def plan(self) -> Plan:
        seed = self.study.baseline
        for families in self.space.per_model:
            seed = self.space.project(seed, families[0])
        yield from self._measure(seed, "start: the default config")
        if self.study.is_app:
            yield from self._bottleneck_climb(seed)
        else:
            best = yield from self._ladder(seed, (0, "batch_size"))
            best = yield from self._ladder(best, (0, "workers"))
            for knob in ("threads", "inter_op_threads"):
                if (0, knob) in self.space.axes(best):
                    best = yield from self._ladder(best, (0, knob))
        for families in self.space.per_model:
            for family in families[1:]:
                config = self.space.project(self._best(), family)
                yield from self._measure(config, f"{family.label} at the best knobs so far")
        yield from self._climb()
        yield from self.remeasure()

    def remaining(self) -> int:
        planned = len(self.space.families) + 8 + self.study.strategy.remeasure
        for families in self.space.per_model:
            planned += len(families[0].batch_sizes) + len(families[0].workers)
        measured = len({t.config for t in self.trials})
        return max(0, min(len(self.space), planned) - measured)

    # ---- walks ----------------------------------------------------------------------------------------

    def _measure(self, config: Point, reason: str) -> Plan:
        if not self.measured(config) and not self.pruned(config):
            yield Proposal(config, 0, reason)

    def _confirm(self, config: Point, reason: str) -> Plan:
        runs = sum(1 for t in self.trials if t.config == config)
        if runs < 2:
            yield Proposal(config, runs, reason)

    def _ladder(self, start: Point, axis: Axis) -> Walk:
        """Step ``axis`` up from ``start`` while the score rises; return the best config of the walk. One step that
        does not rise is not enough to stop (a noisy run, or a knob that pays off only in pairs: two workers on two
        cores under two clients): the step after it is measured too, and the ladder goes on from there if it rose."""
        current = start
        label = f"{axis[1].replace('_', ' ')} ladder"
        while (following := self.space.step(current, axis, 1)) is not None and not self.pruned(following):
            yield from self._measure(following, label)
            if not better(self._verdict(following), self._verdict(current)):
                beyond = self.space.step(following, axis, 1)
                if (
                    beyond is None
                    or self.pruned(beyond)
                    or self._verdict(following).score < 0 <= self._verdict(current).score
                ):
                    break  # off the edge, pruned, or the step already missed the SLA: no second chance
                yield from self._measure(beyond, f"{label}, one step past a flat one")
                if not better(self._verdict(beyond), self._verdict(current)):
                    break
                following = beyond
            current = following
        return current

    def _bottleneck_climb(self, start: Point) -> Plan:
        """An app's walk: from the current point, try its neighbours most promising first (the highest throughput
        bound from the batch curves; before those are known, the steps that give more to the busiest model: a larger
        batch, a worker more, a worker taken from the least busy model) and move to the first that beats it by more
        than noise; stop where none does. A first improvement costs one or two trials, where measuring every
        neighbour of every point on the way would cost a dozen."""
        current = start
        while True:
            for candidate in self._ranked(current):
                if not self.measured(candidate):
                    yield from self._measure(candidate, f"next to {current.key}")
                if self.measured(candidate) and better(self._verdict(candidate), self._verdict(current)):
                    current = candidate
                    break
            else:
                return

    def _ranked(self, point: Point) -> list[Point]:
        """``point``'s neighbours not ruled out, most promising first."""
        order = self._load_order(point)
        rank = {i: r for r, i in enumerate(order)}
        knob_rank = {"batch_size": 0, "workers": 1, "threads": 2}

        def key(candidate: Point) -> tuple[float, int, int]:
            changed = [i for i, (a, b) in enumerate(zip(point.parts, candidate.parts, strict=True)) if a != b]
            more = [i for i in changed if _grows(point.parts[i], candidate.parts[i])]
            model = rank.get(more[0], len(order)) if more else len(order) + 1
            knob = min((knob_rank.get(k, 3) for i in changed for k in _knobs(point.parts[i], candidate.parts[i])),
                       default=3)  # fmt: skip
            bound = self.bounds.throughput(candidate)
            return (-(bound if bound is not None else math.inf), model, knob)

        candidates = [n for n in self.space.neighbours(point) if not self.pruned(n)]
        return sorted(candidates, key=key)

    def _load_order(self, point: Point) -> list[int]:
        """The point's models, busiest workers first: the share of its workers' time each model's stage kept them
        computing (requests/s x handler time per batch / (batch size x workers)), from its last run."""
        trial = next((t for t in reversed(self.trials) if t.config == point and t.result is not None), None)
        if trial is None or trial.result is None:
            return []
        busy = []
        for i, (name, part) in enumerate(zip(self.space.models, point.parts, strict=True)):
            stage = trial.result.stages.get(name)
            srv = stage.server if stage is not None else None
            if stage is None or srv is None or srv.handler is None:
                return []
            batch = srv.batch_size_mean or 1.0
            busy.append((stage.throughput_rps * srv.handler.mean_ms / 1000 / (batch * part.workers), i))
        return [i for _, i in sorted(busy, reverse=True)]

    def _climb(self) -> Plan:
        previous: Point | None = None
        while True:
            best = self._best()
            wave = cheap_order(
                n
                for n in self.space.neighbours(best)
                if not self.measured(n) and not self.pruned(n) and not self._lost_before(n, best, previous)
            )
            if not wave:
                return
            for config in wave:
                yield from self._measure(config, f"neighbour of {best.key}")
            challenger = self._best()
            if not better(self._verdict(challenger), self._verdict(best)):
                return  # nothing beats it by more than noise: a local optimum
            # A move costs a wave of trials: take it on two runs of each side, not on one lucky run.
            for config in cheap_order([best, challenger]):
                yield from self._confirm(config, f"confirm before moving from {best.key} to {challenger.key}")
            if self._best() != challenger or not better(self._verdict(challenger), self._verdict(best)):
                return
            previous = best

    def _lost_before(self, config: Point, best: Point, previous: Point | None) -> bool:
        """After a move from ``previous`` to ``best``, the same step from ``previous`` was measured and clearly lost
        to it: the knobs act alike at both points (they differ in one knob), so the step is not tried again. A loss
        measured only while other processes took the CPU (every run of it contended) says nothing about the step."""
        if previous is None or not _families(config) == _families(best) == _families(previous):
            return False
        counterpart: Point | None = previous
        for axis in self.space.axes(config):
            delta = self.space.index(config, axis) - self.space.index(best, axis)
            if delta and counterpart is not None:
                counterpart = self.space.step(counterpart, axis, delta)
        if counterpart is None or counterpart in (previous, best) or not self.measured(counterpart):
            return False
        if all(t.contended for t in self.trials if t.config == counterpart):
            return False
        return better(self._verdict(previous), self._verdict(counterpart))

    # ---- what is known ---------------------------------------------------------------------------------

    def _verdict(self, config: Point) -> Verdict:
        summary = self.summary(config)
        assert summary is not None, config
        return summary.verdict

    def _best(self) -> Point:
        return self.summaries()[0].config

    def pruned(self, config: Point) -> bool:
        if self.bounds.same_but_delay(config) is not None:
            return True  # its batches were full at another delay: the delay never expired
        passed = [s for s in self.summaries() if s.verdict.passed]
        best = passed[0].verdict.objective if passed else 0.0
        if self.bounds.cannot_win(config, best, self._batches_fill) is not None:
            return True
        for summary in self.summaries():
            other = summary.config
            if _families(other) != _families(config):
                continue
            if summary.figures is None and summary.error and _fewer_workers(other, config):
                return True  # its workers could not start with fewer: they will not start now
            if summary.figures is not None and summary.verdict.typical_miss and self._larger_batch(other, config):
                return True
        return False

    def _larger_batch(self, missed: Point, config: Point) -> bool:
        """``config`` differs from ``missed`` only by a larger batch of one model, where a miss at the smaller batch
        implies one at the larger (``Load.batch_monotone``)."""
        changed = [i for i, (a, b) in enumerate(zip(missed.parts, config.parts, strict=True)) if a != b]
        if len(changed) != 1:
            return False
        a, b = missed.parts[changed[0]], config.parts[changed[0]]
        return (
            dataclasses.replace(a, batch_size=b.batch_size) == b
            and a.batch_size < b.batch_size
            and self.space.family(a).load.batch_monotone(a.workers, a.batch_size)
        )


def _grows(a: Config, b: Config) -> bool:
    """``b`` gives its model more than ``a``: more workers, a larger batch or more threads."""
    return (b.workers, b.batch_size, b.threads) > (a.workers, a.batch_size, a.threads) and b.family == a.family


def _knobs(a: Config, b: Config) -> list[str]:
    return [k for k in ("batch_size", "workers", "threads", "batch_delay_ms", "inter_op_threads", "pinning")
            if getattr(a, k) != getattr(b, k)]  # fmt: skip


def _families(point: Point) -> tuple[str, ...]:
    return tuple(part.family for part in point.parts)


def _fewer_workers(failed: Point, config: Point) -> bool:
    return all(a.workers <= b.workers for a, b in zip(failed.parts, config.parts, strict=True))
