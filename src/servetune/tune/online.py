"""The static winner or the online controller? On a study whose load is a trace (``strategy.controller: true``),
once the winner is named, the same archive with the online controller switched on (docs/controller.md: the study's
SLA, the searched ranges as its bounds, shedding on; it starts from the winner's knobs) replays the same trace, in
interleaved rounds with the winner (static, controller, static, controller, ...), and the one to deploy is chosen:

- **the controller** when it answered a larger share of the trace inside the SLA (attainment: answers inside the
  SLA over requests sent; its 503s for requests it shed are misses) by more than the rounds' noise: the pairwise
  differences (each controller round against the static round nearest it), with Student's t at 95%, lie above 0:
  "the online controller answered 2.1 points more of the trace inside the SLA (95% CI 0.8–3.4, 3 rounds)";
- **the static winner** otherwise (the simpler deployment: nothing moves under it), saying why: the controller was
  no better, or it could not be told better at this noise level.

The rounds are their own phase (``PHASE``): the search's figures and the finalists' choice leave them out, so a
resumed study names the same winner; the controller's family is outside the space (``Study.extra_families``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from servetune.bench.stats import mean_interval
from servetune.tune.deploy import controller_section
from servetune.tune.finalists import CONTROLLER, paired
from servetune.tune.strategies.base import Proposal
from servetune.tune.study import Config, Point, Study
from servetune.tune.targets import target_kind
from servetune.tune.trial import Trial, average, judge

PHASE = CONTROLLER  # both sides' rounds
SUFFIX = "+controller"  # the controller's family: the winner's label with this


def unsupported(study: Study) -> str | None:
    """Why this study cannot compare the controller (``strategy.controller``), None when it can."""
    if study.is_app:
        return "compares one model's winner with its controller; an app study has several models"
    if study.families[0].load.mode != "trace":
        return "the controller is compared on a trace load (load.trace: FILE): a load that moves is what it is for"
    if not target_kind(study.backend).online_controller:
        return f"backend {study.backend} does not run the online controller (docs/controller.md)"
    keys = {k for k, _ in study.sla.limits()} | {k for k, _ in study.sla_scale}
    if not keys & {"p99_ms", "p95_ms", "mean_ms"}:
        return "needs a latency SLA (sla.p99_ms, p95_ms or mean_ms): the controller's deadline"
    return None


def controlled(study: Study, winner: Config) -> tuple[Study, Config] | None:
    """The study with the winner's family copied with the controller switched on (its ``controller:`` section),
    and the winner's knobs in that family; None when the SLA has no latency limit."""
    family = study.family(winner.family)
    section = controller_section(study.sla, family)
    if section is None:
        return None
    label = family.label + SUFFIX
    own = dataclasses.replace(family, label=label, model_config={**family.model_config, "controller": section})
    if all(f.label != label for f in study.extra_families):
        study = dataclasses.replace(study, extra_families=(*study.extra_families, own))
    return study, dataclasses.replace(winner, family=label)


def restore(study: Study, trials: Sequence[Trial]) -> Study:
    """The study with the controller's families of ``trials`` (read back from a checkpoint) known again."""
    for trial in trials:
        family = trial.config.parts[0].family
        if trial.phase == PHASE and family.endswith(SUFFIX):
            base = family.removesuffix(SUFFIX)
            try:
                study.family(base)
            except KeyError:
                continue
            found = controlled(study, dataclasses.replace(trial.config.parts[0], family=base))
            study = found[0] if found is not None else study
    return study


def plan(study: Study, winner: Config, controller: Config, trials: list[Trial]) -> Generator[Proposal, None, None]:
    """The interleaved rounds: static, controller, static, controller, ... (``study.strategy.rounds`` each);
    ``trials`` is read after each yield, so a resumed study measures only the rounds it lacks."""
    for r in range(study.strategy.rounds):
        for config, label in ((winner, "static winner"), (controller, "online controller")):
            done = sum(1 for t in trials if t.config == config and t.phase == PHASE)
            if done > r:
                continue
            repeat = sum(1 for t in trials if t.config == config)
            yield Proposal(config, repeat, f"{label}, round {r + 1} of {study.strategy.rounds}", phase=PHASE)


@dataclass(frozen=True)
class Side:
    """One side's rounds: their mean attainment and P99 (of the rounds' averaged figures), and its verdict."""

    config: Point
    rounds: int
    attainment: float | None  # mean over the rounds that had an SLO figure
    p99_ms: float | None
    passed: bool


@dataclass(frozen=True)
class OnlineVerdict:
    static: Side
    controller: Side
    pairs: int
    difference: float | None  # controller minus static attainment, mean over the pairs (points of 1.0)
    low: float | None
    high: float | None
    use_controller: bool
    reason: str

    def sentence(self) -> str:
        """The comparison for people."""
        if self.difference is None:
            return self.reason[:1].upper() + self.reason[1:] + "."
        rounds = f"{self.pairs} interleaved round{'s' if self.pairs != 1 else ''}"
        diff = f"{100 * self.difference:+.2f} points of attainment"
        if self.low is None or self.high is None:
            return f"The online controller against the static winner: {diff} over {rounds} (too few for an interval)."
        ci = f"95% CI {100 * self.low:+.2f} to {100 * self.high:+.2f}"
        return f"The online controller against the static winner: {diff} ({ci}, {rounds})."


def attainment(trial: Trial) -> float | None:
    """The share of the trace's requests answered inside the SLA (None for a run without SLO figures)."""
    if trial.status != "ok" or trial.result is None or trial.result.slo is None:
        return None
    return trial.result.slo.attainment


def compare(study: Study, trials: Sequence[Trial]) -> OnlineVerdict | None:
    """The verdict of the rounds (None when the study ran none)."""
    study = restore(study, trials)
    ours = [t for t in trials if t.phase == PHASE]
    controller = next((t.config for t in ours if t.config.parts[0].family.endswith(SUFFIX)), None)
    static = next((t.config for t in ours if not t.config.parts[0].family.endswith(SUFFIX)), None)
    if controller is None or static is None:
        return None
    rounds = {c: [t for t in ours if t.config == c] for c in (static, controller)}
    sides = {c: _side(study, c, rounds[c]) for c in rounds}
    diffs = [
        b - a
        for ts, tc in paired(rounds[static], rounds[controller])
        if (a := attainment(ts)) is not None and (b := attainment(tc)) is not None
    ]
    difference = math.fsum(diffs) / len(diffs) if diffs else None
    interval = mean_interval(diffs)
    low, high = (interval[1], interval[2]) if interval else (None, None)
    better = low is not None and low > 0
    if difference is None:
        reason = "the rounds have no attainment to compare: the static winner is kept"
    elif better:
        reason = "the online controller answered more of the trace inside the SLA than the static winner"
    elif low is None:
        reason = "too few rounds to tell the two apart: the static winner is kept (the simpler deployment)"
    elif difference <= 0:
        reason = "the online controller did no better on this trace: the static winner is kept (the simpler deployment)"
    else:
        reason = (
            "the online controller could not be told better at this noise level: the static winner is kept "
            "(the simpler deployment)"
        )
    return OnlineVerdict(sides[static], sides[controller], len(diffs), difference, low, high, better, reason)


def _side(study: Study, config: Point, own: list[Trial]) -> Side:
    measured = [f for t in own if (f := t.figures()) is not None]
    figures = average(measured) if measured else None
    shares = [a for t in own if (a := attainment(t)) is not None]
    mean = math.fsum(shares) / len(shares) if shares else None
    p99 = figures.latency["p99_ms"] if figures is not None else None
    passed = figures is not None and judge(figures, config, study).passed
    return Side(config, len(own), mean, p99, passed)


__all__ = ["PHASE", "SUFFIX", "OnlineVerdict", "Side", "compare", "controlled", "plan", "restore", "unsupported"]
