"""Search strategies against a closed-form performance model: what they propose, prune, and find."""

from __future__ import annotations

import dataclasses

import pytest

from servetune.tune.analysis import analyse
from servetune.tune.space import Space
from servetune.tune.strategies.bounds import Curve
from servetune.tune.study import Config, Load
from servetune.tune.trial import judge
from tune_models import expected_closed_loop
from tune_synthetic import Model, best_by_hand, cost_model, drive, family, study


def test_grid_measures_every_config_once_in_cheap_order_then_remeasures_the_best() -> None:
    s = study(family(workers=(1, 2, 3), batch=(1, 4, 16), delays=(50,)), strategy="grid", remeasure=2)
    trials = drive(s, cost_model())
    first = [t.config for t in trials if t.repeat == 0]
    assert sorted(first) == sorted(Space(s).configs()) and len(first) == 9
    # workers vary fastest: the model is re-registered once per batch size
    assert [(c.batch_size, c.workers) for c in first] == [(b, w) for b in (1, 4, 16) for w in (1, 2, 3)]
    repeats = [t.config for t in trials if t.repeat == 1]
    passed = [x for x in analyse(s, trials[:9]).summaries if x.verdict.passed]
    # only the best is measured again: the runner-up serves half as much, a second run would not lift it
    assert passed[1].throughput_rps < 0.6 * passed[0].throughput_rps
    assert repeats == [passed[0].config]


def test_near_ties_are_all_measured_again() -> None:
    s = study(family(workers=(2,), batch=(4,), delays=(10, 20, 30, 40)), strategy="grid", remeasure=3)
    trials = drive(s, cost_model())
    assert sorted(t.config.batch_delay_ms for t in trials if t.repeat == 1) == [10, 20, 30]  # within 10% of the best


def test_a_tail_miss_in_a_contended_run_is_measured_again_and_judged_on_the_run_in_peace() -> None:
    # The best config's first run stalled while another process took a core: P99 433 ms over a 180 ms median (a CI
    # run beside another test file measured this). It is measured again at the end, and its runs measured in peace
    # decide: it wins. A miss by the median, contended or not, stays a miss.
    s = study(family(workers=(1, 2), batch=(1, 4), delays=(50,)), strategy="grid", remeasure=1)
    best = Config("eager/cpu", 2, 4, 50)
    stalled = {best: (44.0, 433.0, 180.0)}
    trials = drive(s, cost_model(), disturbed=lambda i, c: stalled.get(c) if i < 4 else None)
    first, second = [t for t in trials if t.config == best]
    assert first.contended and not judge(first.figures(), best, s).passed
    assert not second.contended and second.reason == "re-measure a near miss"
    analysis = analyse(s, trials)
    assert analysis.winner is not None and analysis.winner.config == best
    assert analysis.winner.figures == second.figures()  # the contended run left out, not averaged in
    # every run contended: the least disturbed one is judged
    twice = {0: (44.0, 433.0, 180.0), 1: (44.0, 250.0, 180.0)}
    both = drive(s, cost_model(), disturbed=lambda i, c: twice[int(i >= 4)] if c == best else None)
    assert [t.contended for t in both if t.config == best] == [True, True]
    assert analyse(s, both).winner.config == best  # type: ignore[union-attr]
    # a typical miss (the median over the SLA too) is not measured again for being contended
    slow = drive(s, cost_model(), disturbed=lambda i, c: (44.0, 433.0, 320.0) if c == best else None)
    assert [t.repeat for t in slow if t.config == best] == [0]
    assert analyse(s, slow).winner.config == Config("eager/cpu", 1, 4, 50)  # type: ignore[union-attr]


def test_adaptive_finds_the_grid_best_in_a_fraction_of_the_trials() -> None:
    model = cost_model()
    grid = study(strategy="grid")
    adaptive = study(strategy="adaptive")
    assert len(Space(grid)) == 72
    expected = best_by_hand(grid, model)
    assert expected == Config("eager/cpu", 2, 8, 10)  # 2 slots of batch 8 (260 ms) fit the 300 ms SLA
    grid_trials, adaptive_trials = drive(grid, model), drive(adaptive, model)
    assert analyse(grid, grid_trials).winner.config == expected  # type: ignore[union-attr]
    assert analyse(adaptive, adaptive_trials).winner.config == expected  # type: ignore[union-attr]
    assert len(adaptive_trials) <= 0.3 * len(grid_trials)


def test_adaptive_prunes_larger_batches_after_a_clear_latency_miss() -> None:
    s = study()
    trials = drive(s, cost_model())
    seen: list[Config] = []
    pruned = 0
    for trial in trials:
        c = trial.config
        for earlier in seen:
            verdict = judge(next(t for t in trials if t.config == earlier).figures(), earlier, s)
            same_line = (earlier.workers, earlier.batch_delay_ms) == (c.workers, c.batch_delay_ms)
            assert not (same_line and earlier.batch_size < c.batch_size and verdict.typical_miss), (earlier, c)
            pruned += verdict.typical_miss
        seen.append(c)
    assert pruned  # the rule was exercised


def test_a_tail_miss_is_not_enough_to_prune() -> None:
    # Batch 1 misses in its tail only (one stall: P99 2 s over a 40 ms median): batch 2 is still tried, and wins.
    def model(c: Config) -> tuple[float, ...]:
        return (25.0, 2000.0, 40.0) if c.batch_size == 1 else (40.0 * c.batch_size, 60.0 * c.batch_size)

    s = study(family(workers=(1,), batch=(1, 2, 4, 8), delays=(10,)))
    trials = drive(s, model)
    assert trials[0].config.batch_size == 1 and not judge(trials[0].figures(), trials[0].config, s).passed
    assert analyse(s, trials).winner.config.batch_size == 4  # type: ignore[union-attr]
    proportional = study(family(workers=(1,), batch=(1, 2, 4, 8), delays=(10,)), p99_ms=30)
    assert [t.config.batch_size for t in drive(proportional, model)] == [1]  # the median misses too: pruned


def test_fixed_concurrency_does_not_prune_batches_that_can_drain_the_queue() -> None:
    # 16 clients on one worker: batch 1 queues them (misses), batch 16 serves them at once (meets the SLA).
    def model(c: Config) -> tuple[float, float]:
        service = 100 + 5 * c.batch_size
        rounds = -(-16 // (c.batch_size * c.workers))
        return c.batch_size * c.workers * 1000 / service, service * rounds

    load = Load(concurrency=16)
    s = study(family(workers=(1,), batch=(1, 2, 4, 8, 16), delays=(10,), load=load), p99_ms=250)
    trials = drive(s, model)
    assert analyse(s, trials).winner.config.batch_size == 16  # type: ignore[union-attr]
    proportional = study(family(workers=(1,), batch=(1, 2, 4, 8, 16), delays=(10,)), p99_ms=50)
    assert {t.config.batch_size for t in drive(proportional, model)} == {1}  # a miss at batch 1 ends the ladder


def test_an_infeasible_sla_ends_with_the_closest_config() -> None:
    s = study(p99_ms=50)
    trials = drive(s, cost_model())
    analysis = analyse(s, trials)
    assert analysis.winner is None
    assert analysis.closest is not None and analysis.closest.config.batch_size == 1
    assert analysis.closest.verdict.violation > 1  # 110 ms or more against 50
    assert len(trials) <= 12


def test_a_family_whose_workers_cannot_start_is_abandoned() -> None:
    good, broken = family("eager/cpu"), family("fp16/cpu")
    s = study(good, broken)
    model = cost_model()
    trials = drive(s, lambda c: None if c.family == "fp16/cpu" else model(c))
    assert sum(t.config.family == "fp16/cpu" for t in trials) == 1
    assert analyse(s, trials).winner.config.family == "eager/cpu"  # type: ignore[union-attr]


def test_a_better_family_is_found_and_climbed() -> None:
    slow, fast = family("eager/cpu"), family("bf16/cpu")
    s = study(slow, fast)
    base = cost_model()
    fast_model = cost_model(a_ms=50, b_ms=10)
    trials = drive(s, lambda c: fast_model(c) if c.family == "bf16/cpu" else base(c))
    winner = analyse(s, trials).winner
    assert winner is not None and winner.config == best_by_hand(s, lambda c: fast_model(c) if c.family ==
                                                                 "bf16/cpu" else base(c))  # fmt: skip
    assert winner.config.family == "bf16/cpu"


def test_remeasuring_averages_out_a_lucky_trial() -> None:
    s = study(family(workers=(1, 2), batch=(1, 2, 4), delays=(10,)), strategy="grid", remeasure=3)
    trials = drive(s, cost_model(), noise=lambda i: 3.0 if i == 1 else 1.0)
    lucky = trials[1].config
    assert lucky == Config("eager/cpu", 2, 1, 10)  # 3 x 16.6 req/s: briefly the best of the grid
    assert analyse(s, trials[:6]).winner.config == lucky  # type: ignore[union-attr]
    assert [t.repeat for t in trials if t.config == lucky] == [0, 1]
    assert analyse(s, trials).winner.config == Config("eager/cpu", 2, 4, 10)  # type: ignore[union-attr]


def test_the_same_results_give_the_same_proposals() -> None:
    s = study()
    first = [(t.config, t.repeat) for t in drive(s, cost_model())]
    second = [(t.config, t.repeat) for t in drive(dataclasses.replace(s), cost_model())]
    assert first == second


def test_one_flat_step_does_not_end_a_ladder() -> None:
    # Two workers measure no better than one (a noisy run, or clients too few to keep both busy), three do.
    def model(c: Config) -> tuple[float, float]:
        return {1: 20.0, 2: 20.0, 3: 40.0, 4: 39.0}[c.workers], 50.0

    s = study(family(workers=(1, 2, 3, 4), batch=(1,), delays=(10,)), remeasure=0)
    trials = drive(s, model)
    assert [t.config.workers for t in trials] == [1, 2, 3, 4]
    assert analyse(s, trials).winner.config.workers == 3  # type: ignore[union-attr]

    # Two flat steps in a row end it: 4 workers are never tried.
    def flat(c: Config) -> tuple[float, float]:
        return {1: 20.0, 2: 20.0, 3: 20.0, 4: 80.0}[c.workers], 50.0

    assert [t.config.workers for t in drive(s, flat)] == [1, 2, 3]


def plateau(lucky: dict[Config, float] | None = None) -> Model:
    """1 worker serves 20 req/s, 2 workers 40 whatever else; 3 workers no more; ``lucky`` configs' first run gains
    the given fraction."""
    runs: dict[Config, int] = {}

    def measure(c: Config) -> tuple[float, float]:
        runs[c] = runs.get(c, 0) + 1
        gain = (lucky or {}).get(c, 0.0) if runs[c] == 1 else 0.0
        base = 20.0 * (1 + 0.07 * (c.batch_size > 1)) if c.workers == 1 else 40.0
        return base * (1 + gain), 20.0 * c.batch_size

    return measure


def test_a_move_of_the_climb_needs_a_second_run() -> None:
    # A neighbour's first run beats the best by 3% (more than RISE); its second run does not: no move.
    s = study(family(workers=(1, 2, 3), batch=(1, 2, 4), delays=(10, 50)), p99_ms=150, remeasure=2)
    lucky = Config("eager/cpu", 2, 2, 10)
    trials = drive(s, plateau({lucky: 0.03}))
    assert [(t.config, t.repeat) for t in trials if "confirm" in t.reason] == [
        (lucky, 1), (Config("eager/cpu", 2, 2, 50), 1)
    ]  # fmt: skip
    assert not any(t.reason == f"neighbour of {lucky.key}" for t in trials)
    # With a real gain (two runs agree), the climb moves on.
    steady = drive(s, lambda c: plateau()(c) if c != lucky else (41.2, 20.0 * c.batch_size))
    assert any(t.reason == f"neighbour of {lucky.key}" for t in steady)
    assert analyse(s, steady).winner.config == lucky  # type: ignore[union-attr]


def test_after_a_move_steps_that_lost_before_are_not_tried_again() -> None:
    # Separable knobs: throughput = f(workers, batch) x g(delay). The climb moves along the delay; from the new
    # centre it does not re-try the worker and batch steps that lost from the old one.
    def model(c: Config) -> tuple[float, float]:
        base = 20.0 if c.workers == 1 else 40.0 - 5.0 * abs(c.batch_size - 2) - 5.0 * (c.workers - 2)
        return base * {10: 0.9, 50: 1.0, 100: 1.1}[c.batch_delay_ms], 20.0 * c.batch_size

    s = study(family(workers=(1, 2, 3), batch=(1, 2, 4), delays=(10, 50, 100)), p99_ms=150, remeasure=2)
    trials = drive(s, model)
    best = Config("eager/cpu", 2, 2, 100)
    assert analyse(s, trials).winner.config == best  # type: ignore[union-attr]
    assert any(t.reason == "neighbour of eager/cpu|w2|b2|d50" for t in trials)
    # From the new centre only w3|b2 is tried: its counterpart w3|b2|d50 was never measured; the other steps
    # (w1|b2, w2|b4, and the anti-diagonals w3|b1, w1|b4) lost from w2|b2|d50.
    from_best = [t.config for t in trials if t.reason == f"neighbour of {best.key}"]
    assert from_best == [Config("eager/cpu", 3, 2, 100)]
    assert len({t.config for t in trials}) <= len(Space(s)) // 2
    # A loss measured only while another process took a core is no loss: w2|b4|d50 measured nothing but contended
    # runs (a hog on the machine), so w2|b4 is tried from the new centre too.
    slowed = Config("eager/cpu", 2, 4, 50)
    hogged = drive(s, model, disturbed=lambda i, c: (10.0, 80.0) if c == slowed else None)
    assert all(t.contended for t in hogged if t.config == slowed)
    again = [t.config for t in hogged if t.reason == f"neighbour of {best.key}"]
    assert Config("eager/cpu", 2, 4, 100) in again
    assert analyse(s, hogged).winner.config == best  # type: ignore[union-attr]


# -- bounds learned from the server's timing headers --------------------------------------------------------

A_MS, B_MS, SLOTS = 100.0, 20.0, 2


def known_cost(config: Config) -> tuple[float, float]:
    """The known-cost model in closed loop (batches fill; the delay never expires, so it changes nothing)."""
    return expected_closed_loop(A_MS, B_MS, SLOTS, config.workers, config.batch_size)


def handler_time(config: Config) -> float:
    """What the server reports as the handler's time per batch: the model's cost, and, with more workers than
    slots, the wait for a slot (it happens inside the handler)."""
    rounds = -(-config.workers // min(config.workers, SLOTS))
    return (A_MS + B_MS * config.batch_size) * rounds


def test_the_batch_curve_is_a_line_through_the_fastest_batches() -> None:
    curve = Curve()
    for batch, handler in ((1, 120.0), (2, 140.0), (2, 190.0), (4, 180.0)):  # 190: a batch that waited for a core
        curve.add(batch, handler)
    assert curve.predict(8) == pytest.approx(A_MS + B_MS * 8) and curve.predict(16) == pytest.approx(420.0)
    single = Curve()
    single.add(1, 120.0)
    assert single.predict(4) is None  # one size says nothing about the slope


def test_bounds_from_the_timing_headers_skip_what_cannot_win() -> None:
    s = study(family(delays=(5, 10, 25, 50)), remeasure=3)  # 144 configs
    assert len(Space(s)) == 144
    expected = best_by_hand(s, known_cost)
    with_headers = drive(s, known_cost, handler=handler_time)
    without = drive(s, known_cost)
    winner = analyse(s, with_headers).winner
    assert winner is not None and (winner.config.workers, winner.config.batch_size) == (2, 8)
    assert winner.throughput_rps == pytest.approx(known_cost(expected)[0])
    measured = {t.config for t in with_headers}
    # by the batch curve (100 + 20 b ms, fitted from batches 1-8 at one worker): batch 16 takes 420 ms, over the
    # 300 ms SLA with any workers; 2 x batch 4 serve at most 44 req/s against 61.5; 1 x batch 16 at most 38
    assert not {c for c in measured if c.batch_size >= 16 or (c.workers, c.batch_size) in ((2, 4), (3, 4))}
    # the batches were full: the delay never expired, so no other delay is measured
    assert {c.batch_delay_ms for c in measured} == {25}
    assert len(measured) <= 7 < len({t.config for t in without})
