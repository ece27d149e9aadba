"""The one loop: a strategy proposes, the runner measures (or the checkpoint already has it), the strategy observes,
the checkpoint grows; then the report, the plots and the deploy artifacts."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from servetune._exceptions import ConfigError
from servetune.tune import finalists as final
from servetune.tune import online
from servetune.tune.analysis import Analysis, analyse
from servetune.tune.calibrate import Calibrator
from servetune.tune.checkpoint import Checkpoint
from servetune.tune.deploy import Deployment, write_deployment
from servetune.tune.plots import write_plots
from servetune.tune.progress import TuneProgress
from servetune.tune.report import markdown, write_trials_csv
from servetune.tune.runner import TrialRunner
from servetune.tune.space import Space
from servetune.tune.strategies import Proposal, Strategy, load_strategy
from servetune.tune.study import Study
from servetune.tune.targets import Target, prepare, target_kind
from servetune.tune.targets.remote import RemoteTarget
from servetune.tune.trial import Trial, judge

RESERVED = "the rest of the budget is left for the interleaved rounds (finalists, online controller)"


@dataclass
class TuneResult:
    study: Study
    out_dir: Path
    trials: list[Trial]
    analysis: Analysis
    measured: int  # trials measured by this run
    resumed: int  # trials read back from the checkpoint
    stopped: str | None  # why the search ended early, if it did
    notes: list[str] = field(default_factory=list)
    deployment: Deployment | None = None
    report: Path | None = None
    plots: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Remote:
    """Tune an already running server instead of an embedded one."""

    url: str
    management_url: str | None = None
    metrics_url: str | None = None
    key_file: Path | None = None


def tune(study: Study, out_dir: Path, *, remote: Remote | None = None, console: Console | None = None) -> TuneResult:
    """Run ``study`` (resuming from ``out_dir``'s checkpoint) and write every output into ``out_dir``."""
    console = console or Console(stderr=True)
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    target: Target
    if remote is not None:
        if study.is_app:
            raise ConfigError("--url: tunes one model of a running server; an app study starts its own server")
        remote_target = RemoteTarget(
            remote.url,
            study.model,
            management_url=remote.management_url,
            metrics_url=remote.metrics_url,
            key_file=remote.key_file,
        )
        remote_target.start()
        if study.backend != "native":
            notes.append(f"backend {study.backend}: --url tunes the running server as it is (none is started)")
        study, remote_notes = remote_target.adapt(study)
        notes += remote_notes
        if study.strategy.controller:
            notes.append("--url: the online controller is compared on a server the tuner starts, not a running one")
            study = dataclasses.replace(study, strategy=dataclasses.replace(study.strategy, controller=False))
        target = remote_target
    else:
        study = prepare(study)
        target = target_kind(study.backend).embedded(study, out_dir)
    for note in (*study.notes, *notes):
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    run = _Run(study, out_dir, target, console)
    try:
        run.loop()
    finally:
        target.close()
    notes += run.notes
    return _finish(run, notes, served_url=target.archive_url(study.families[0]) if remote else None)


class _Run:
    def __init__(self, study: Study, out_dir: Path, target: Target, console: Console) -> None:
        self.study = study
        self.out_dir = out_dir
        self.console = console
        self.runner = TrialRunner(study, target)
        self.space = Space(study)
        self.strategy: Strategy = load_strategy(study.strategy.name)(self.space, study)
        self.checkpoint = Checkpoint(out_dir / "trials.jsonl", study.fingerprint())  # of the study as written
        self.notes: list[str] = []
        self.trials: list[Trial] = []
        self.measured = 0
        self.stopped: str | None = None
        self.final_phase = False  # measuring the finalists' rounds: nothing left to reserve budget for
        self.online_phase = False  # measuring the winner against the online controller (``online.py``)
        self.started = time.monotonic()
        self._walls: list[float] = []

    def calibrate(self) -> None:
        """Measure what the study sizes on this machine (``calibrate.py``) before the first trial."""
        calibrator = Calibrator(self.study, self.runner, self.out_dir, self._say)
        study, sentence = calibrator.sla()
        if sentence is not None:
            self._say(sentence)
            self.notes.append(sentence)
        self.runner.measurer.schedule = calibrator.schedule()
        if study is not self.study:
            self._use(study)
            self.space = Space(study)
            self.strategy = load_strategy(study.strategy.name)(self.space, study)

    def _use(self, study: Study) -> None:
        self.study = study
        self.runner.use(study)

    def _say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def loop(self) -> None:
        try:
            self.calibrate()
        except KeyboardInterrupt:
            self.stopped = "interrupted"
            return
        previous = {t.key: t for t in self.checkpoint.load()}
        self._use(online.restore(self.study, list(previous.values())))
        if self.checkpoint.note:
            self.notes.append(self.checkpoint.note)
            self.console.print(f"[yellow]note:[/] {self.checkpoint.note}", highlight=False)
        self.checkpoint.rewrite(list(previous.values()))
        if previous:
            self.console.print(f"resuming: {len(previous)} trials already in {self.checkpoint.path}", highlight=False)
        self.next_index = max((t.index for t in previous.values()), default=-1) + 1
        with TuneProgress(self.console, f"tune {self.study.model}", budget_s=self.study.budget.seconds) as bar:
            self.bar = bar
            first = {self.study.baseline: Proposal(self.study.baseline, 0, "the default config (1 worker, batch 1)")}
            for label, config in self.study.references:  # a reference that is the default is measured once
                first.setdefault(config, Proposal(config, 0, f"reference: {label}"))
            try:
                if all(self._take(proposal, previous) for proposal in first.values()):
                    following = self.strategy.propose()
                    while following is not None and self._take(following, previous):
                        following = self.strategy.propose()
                    if self._reserved_only("the search"):
                        self._finalists(previous)
                        if self.study.strategy.controller and self._reserved_only("the finalists' rounds"):
                            self._online(previous)
            except KeyboardInterrupt:
                self.stopped = "interrupted"
        for note in self.runner.measurer.notes:
            self.notes.append(note)
            self._say(f"[yellow]note:[/] {note}")
        if self.stopped:
            self.notes.append(f"the search stopped early: {self.stopped}; run again to resume")

    def _finalists(self, previous: dict[tuple[str, int], Trial]) -> None:
        """Measure the finalists again, interleaved, before the winner is named (``finalists.py``)."""
        chosen = final.choose_finalists(self.study, self.trials, list(self.space.configs()))
        if len(chosen) < 2:
            return
        self.bar.line(
            f"finalists: {', '.join(c.key for c in chosen)}: measured again, interleaved, "
            f"{self.study.strategy.rounds} rounds each",
        )
        self.final_phase = True
        for proposal in final.plan(self.study, chosen, self.trials):
            if not self._take(proposal, previous):
                return
        second = final.second_finalists(self.study, self.trials, chosen, list(self.space.configs()))
        if second and not self._room_for(len(second) * self.study.strategy.rounds):
            self.notes.append(
                f"the rounds' best, {second[0].key}, was not the search's; comparing it with its simpler neighbours "
                "would exceed the budget: not done"
            )
        elif second:
            self.bar.line(
                f"the rounds' best, {second[0].key}, was not the search's: measured again with its simpler "
                f"neighbours {', '.join(c.key for c in second[1:])}, interleaved, "
                f"{self.study.strategy.rounds} rounds each",
            )
            for proposal in final.plan(self.study, second, self.trials, phase=final.SECOND):
                if not self._take(proposal, previous):
                    return

    def _reserved_only(self, what: str) -> bool:
        """Whether nothing stopped the run but the budget kept for the rounds that follow (then noted, and cleared)."""
        if self.stopped is not None and self.stopped.startswith(RESERVED):
            self.notes.append(f"{what} ended early: {self.stopped}")
            self.stopped = None
        return self.stopped is None

    def _online(self, previous: dict[tuple[str, int], Trial]) -> None:
        """The winner against the online controller on the study's trace, interleaved (``online.py``)."""
        winner = analyse(self.study, self.trials).winner
        if winner is None:
            self.notes.append("no config met the SLA: the online controller was not compared with a winner")
            return
        found = online.controlled(self.study, winner.config.parts[0])
        if found is None:
            return
        self._use(found[0])
        static, controller = winner.config.parts[0], found[1]
        rounds = self.study.strategy.rounds
        self.online_phase = True
        if not self._room_for(2 * rounds):
            self.notes.append("comparing the winner with the online controller would exceed the budget: not done")
            return
        self.bar.line(f"the winner against the online controller on the trace: interleaved, {rounds} rounds each")
        for proposal in online.plan(self.study, static, controller, self.trials):
            if not self._take(proposal, previous):
                return

    def _take(self, proposal: Proposal, previous: dict[tuple[str, int], Trial]) -> bool:
        key = (proposal.config.key, proposal.repeat)
        trial = previous.get(key)
        if trial is None:
            reason = self._over_budget()
            if reason is not None:
                self.stopped = reason
                return False
            passed = [s for s in self.strategy.summaries() if s.verdict.passed]
            self.runner.measurer.best_objective = passed[0].verdict.objective if passed else None
            trial = self.runner.run(proposal, self.next_index)
            self.next_index += 1
            self.measured += 1
            self._walls.append(trial.wall_s)
            self.checkpoint.append(trial)
            self._print(trial)
        self.trials.append(trial)
        if trial.phase != online.PHASE:  # the search is over: the controller's family is not in its space
            self.strategy.observe(trial)
        self.bar.update(len(self.trials), self.strategy.remaining(), self._best(),
                        wall_s=trial.wall_s if key not in previous else None)  # fmt: skip
        return True

    def _short_of(self, trials: int) -> tuple[bool, bool]:
        """Whether this many more trials would pass the trial budget, and the time budget (at the mean trial's wall
        time so far)."""
        budget = self.study.budget
        count = budget.trials is not None and len(self.trials) + trials > budget.trials
        expected = sum(self._walls) / len(self._walls) if self._walls else 0.0
        seconds = budget.seconds is not None and time.monotonic() - self.started + expected * trials > budget.seconds
        return count, seconds

    def _room_for(self, trials: int) -> bool:
        return not any(self._short_of(trials))

    def _over_budget(self) -> str | None:
        """Why no other trial may start, if one may not. The search leaves room in the budget for the finalists'
        rounds (the winner is not named on one lucky run because the search used the time up)."""
        budget = self.study.budget
        strategy = self.study.strategy
        reserve = 2 * strategy.rounds if strategy.controller and not self.online_phase else 0
        if not self.final_phase and not self.online_phase and strategy.finalists >= 2:
            # only while there are finalists to compare: two configs or more within reach of the best
            finalists = final.choose_finalists(self.study, self.trials, list(self.space.configs()))
            reserve += len(finalists) * strategy.rounds if len(finalists) >= 2 else 0
        (count, seconds), (count_reserved, seconds_reserved) = self._short_of(1), self._short_of(1 + reserve)
        if count:
            return f"the trial budget ({budget.trials}) is used up"
        if count_reserved:
            return f"{RESERVED} ({reserve} of the trial budget, {budget.trials})"
        if seconds:
            return f"the time budget ({budget.describe()}) would be exceeded by another trial"
        if seconds_reserved:
            expected = sum(self._walls) / len(self._walls) if self._walls else 0.0
            return f"{RESERVED} (about {expected * reserve / 60:.1f} min of the time budget)"
        return None

    def _best(self) -> str:
        passed = [s for s in self.strategy.summaries() if s.verdict.passed]
        if not passed:
            return "none meets the SLA yet"
        best = passed[0]
        return f"{best.config.key} {best.throughput_rps:.1f} req/s P99 {best.latency('p99_ms') or 0:.0f} ms"

    def _print(self, trial: Trial) -> None:
        head = f"trial {trial.index:>3} {trial.config.key}"
        if trial.status != "ok" or trial.result is None:
            self.bar.line(f"{head}: [red]error[/] {trial.error}")
            return
        verdict = judge(trial.figures(), trial.config, self.study)
        p99 = trial.result.latency.p99_ms if trial.result.latency else float("nan")
        load = ", ".join(f"{k} {v}" for k, v in trial.load.items())
        mark = "[green]pass[/]" if verdict.passed else f"[red]miss[/] ({verdict.reason})"
        seconds = f" in {trial.result.duration_s:.1f} s" if trial.result.duration_s else ""
        noise = f" [yellow]{trial.interference()}[/]" if trial.contended or trial.remeasured else ""
        self.bar.line(f"{head}: {trial.result.throughput_rps:.1f} req/s, P99 {p99:.1f} ms{seconds} [{load}] {mark}"
                      f"{noise}")  # fmt: skip


def _finish(run: _Run, notes: list[str], *, served_url: str | None) -> TuneResult:
    study, out_dir = run.study, run.out_dir
    analysis = analyse(study, run.trials)
    write_trials_csv(run.trials, study, out_dir / "trials.csv")
    plots = write_plots(analysis, study, out_dir)
    deployment = None
    if analysis.winner is not None:
        use_controller = analysis.online is not None and analysis.online.use_controller
        deployment = write_deployment(
            study, analysis.winner.config, out_dir, served_url=served_url, controller=use_controller
        )
    report = out_dir / "report.md"
    report.write_text(
        markdown(
            analysis,
            study,
            run.trials,
            notes=[*study.notes, *notes],
            serve_command=deployment.serve_command if deployment else None,
            alternatives=deployment.alternatives if deployment else (),
            plots=[p.name for p in plots],
        )
    )
    return TuneResult(study, out_dir, run.trials, analysis, run.measured, len(run.trials) - run.measured,
                      run.stopped, notes, deployment, report, plots)  # fmt: skip
