"""The control law, the fit, the rate meter, the settings and the policies' hysteresis, on figures computed by hand
(docs/controller.md derives the law)."""

from __future__ import annotations

import pytest

from servetune._exceptions import ConfigError
from servetune.control import Cost, Knobs, completion_ms, decide, parse_settings
from servetune.control.estimate import RateMeter, ServiceFit
from servetune.control.law import (
    ThreadCost,
    batch_cap,
    batch_needed,
    batching_gain,
    decide_threads,
    measured_bounds,
    rescaled,
    useful_cap,
)
from servetune.control.policy import View, make_policy, thread_cost
from servetune.control.slo_policy import HOLD_S, WORKERS_HOLD_S

COST = Cost(20.0, 5.0)  # a batch of n takes 20 + 5n ms


def test_batch_cap_is_the_largest_batch_whose_worst_case_fits() -> None:
    # 2 * (20 + 5n) <= 198  ->  n <= 15.8
    assert batch_cap(COST, 198.0, 0.0, (1, 32)) == 15
    assert batch_cap(COST, 198.0, 60.0, (1, 32)) == 9  # (198 - 60) / 2 = 69 -> n <= 9.8
    assert batch_cap(COST, 198.0, 0.0, (1, 8)) == 8  # within bounds
    assert batch_cap(COST, 30.0, 0.0, (2, 8)) == 2  # nothing fits: the bounds' low end
    assert batch_cap(COST, 198.0, 0.0, (1, 32), workers=2) == 22  # 1.5 (20 + 5n) <= 198: the first of two frees


def test_batch_needed_keeps_each_worker_under_rho() -> None:
    # per worker 0.1 req/ms: 0.1 * (20 + 5n) <= 0.8 n  ->  n >= 2 / 0.3 = 6.67
    assert batch_needed(COST, 100.0, 1) == 7
    assert batch_needed(COST, 20.0, 1) == 1
    assert batch_needed(COST, 100.0, 4) == 1  # 0.025 * 20 / (0.8 - 0.125) = 0.74
    assert batch_needed(COST, 200.0, 1) is None  # 0.2 * 5 = 1 > 0.8: no batch size keeps up


@pytest.mark.parametrize(
    ("rate", "workers", "expected", "n_need"),
    [
        (20.0, (1, 1), Knobs(15, 0.0, 1), 1),  # 2 (20 + 5n) <= 198 -> 15; batches of one keep up
        (100.0, (1, 1), Knobs(15, 0.0, 1), 7),  # n_need = ceil(0.1 * 20 / (0.8 - 0.1 * 5)) = 7 <= 15: it holds
        # 150 / (0.8 * 15 / 95 ms) = 1.19 -> 2 workers, whose cap is 1.5 (20 + 5n) <= 198 -> 22; 0.075 * 20 / 0.425
        (150.0, (1, 4), Knobs(22, 0.0, 2), 4),
        (200.0, (1, 4), Knobs(22, 0.0, 2), 7),  # 200 / 126.3 = 1.58 -> 2 workers
    ],
)
def test_decide_by_hand(rate: float, workers: tuple[int, int], expected: Knobs, n_need: int) -> None:
    result = decide(COST, rate, 200.0, 0.0, (1, 32), (0, 100), workers)
    assert result.knobs == expected
    assert result.n_need == n_need
    assert result.feasible
    assert result.worst_ms <= 198.0


def test_each_worker_count_is_judged_at_its_own_cap() -> None:
    # a = 25, b = 2.5, SLA 100 ms, margin 10 (budget 88): one worker waits for a whole batch, 2 (25 + 2.5n) <= 88 ->
    # 7, 7 / 42.5 ms = 165 req/s; two wait for half of one, 1.5 (25 + 2.5n) <= 88 -> 13, 13 / 57.5 ms = 226 req/s
    # each. At 291 req/s, 2 x 226 x 0.8 = 362 holds it: 2 workers at 13 (sized at one worker's cap, 291 / (0.8 x
    # 165) = 2.2, it took 3, each batching less, and a worker started for a peak of a second or two)
    result = decide(Cost(25.0, 2.5), 291.0, 100.0, 10.0, (1, 32), (0, 50), (1, 4))
    assert result.knobs == Knobs(13, 0.0, 2)
    assert decide(Cost(25.0, 2.5), 370.0, 100.0, 10.0, (1, 32), (0, 50), (1, 4)).knobs.workers == 3  # 362 < 370


def test_a_batch_that_costs_in_proportion_to_its_size_is_formed_only_when_the_load_needs_it() -> None:
    # resnet18 on a CPU core: t(n) = 1.6 + 42.5n ms (cautious b 45), SLA 176, margin 10 (budget 164). Two workers'
    # worst case fits a pair (1.5 (1.6 + 45 x 2) = 137 <= 164), but pairs carry 2 / 86.6 ms against 1 / 44.1 ms:
    # 1.8% more per second, under GAIN_FLOOR (10%): batches of one at every rate, the load held or not
    cost, cautious = Cost(1.6, 42.5), Cost(1.6, 45.0)
    assert batching_gain(cost, 2) == pytest.approx(2 * 44.1 / 86.6 - 1)
    for rate in (10.0, 30.0, 36.0, 44.0):
        result = decide(cost, rate, 176.0, 10.0, (1, 4), (0, 0), (2, 2), cautious)
        assert result.knobs.batch_size == 1, rate
        assert result.feasible == (rate <= 36.0)  # 44 req/s: 0.022 x 42.5 = 0.94 > 0.8 busy at any batch
    # a = 4, b = 40: pairs carry 4.8% more; at 19 req/s one worker needs them (0.019 x 4 / (0.8 - 0.019 x 40) = 1.9
    # -> 2) and the SLA (200) allows them (2 x 84 = 168): the batch the load needs, and no more at 10 req/s
    assert decide(Cost(4.0, 40.0), 19.0, 200.0, 0.0, (1, 4), (0, 0), (1, 1)).knobs.batch_size == 2
    assert decide(Cost(4.0, 40.0), 10.0, 200.0, 0.0, (1, 4), (0, 0), (1, 1)).knobs.batch_size == 1
    # where batching pays, the cap is the largest the SLA allows, whatever the load needs: a = 25, b = 2.5, a batch
    # of 13 carries 6.2x a batch of one
    assert useful_cap(Cost(25.0, 2.5), 13, 1, 1) == 13
    assert useful_cap(cost, 4, 3, 2) == 3  # the bounds' least is the reference: 3 needed of at least 2
    assert useful_cap(cost, 4, None, 2) == 2  # no batch is enough: the least


def test_decide_keeps_the_delay_at_its_lower_bound_and_the_cap_within_what_it_leaves() -> None:
    result = decide(COST, 100.0, 200.0, 0.0, (1, 32), (20, 100), (1, 1))
    assert result.knobs == Knobs(13, 20.0, 1)  # 20 + 2 (20 + 5n) <= 198 -> n <= 13.8


def test_decide_says_when_the_bounds_cannot_hold_the_load() -> None:
    result = decide(COST, 400.0, 200.0, 0.0, (1, 32), (0, 100), (1, 1))
    assert not result.feasible
    assert result.knobs.workers == 1


def test_completion_counts_the_queue_the_busy_workers_and_its_own_batch() -> None:
    assert completion_ms(COST, 0, 10, [], 1) == 25.0  # idle worker, a batch of one
    assert completion_ms(COST, 0, 10, [], 1, delay_ms=30.0) == 55.0  # it waits the delay for company
    # 25 ahead in batches of 10 on one worker busy 30 ms more: 30 + 70 + 70, then its batch of 6: 50
    assert completion_ms(COST, 25, 10, [30.0], 1) == 220.0
    # two workers, one idle: the full batches go to the idle one (done at 70) and the other (30 + 70); its own
    # batch of one on the first free, at 70
    assert completion_ms(COST, 20, 10, [30.0], 2) == 70.0 + 25.0


def test_completion_counts_the_arrivals_that_fill_its_batch_while_it_waits() -> None:
    # 2 ahead, the one worker busy 30 ms more: at 100 req/s three more arrive before it frees, so its batch is
    # 2 + 1 + 3 = 6 (20 + 30 ms), not 3
    assert completion_ms(COST, 2, 10, [30.0], 1, arrival_rate=100.0) == 30.0 + 50.0
    assert completion_ms(COST, 2, 10, [30.0], 1) == 30.0 + 35.0  # no rate known: its share alone
    # never past the batch size: 1,000 req/s would bring 30 in those 30 ms
    assert completion_ms(COST, 2, 10, [30.0], 1, arrival_rate=1000.0) == 30.0 + 70.0
    # behind two full batches the worker frees at 30 + 70 + 70 = 170 ms: 17 arrive at 100 req/s, the batch is full
    assert completion_ms(COST, 25, 10, [30.0], 1, arrival_rate=100.0) == 170.0 + 70.0
    # an idle worker takes it at once: nobody joins (the delay's company is not waited for here)
    assert completion_ms(COST, 0, 10, [], 1, arrival_rate=1000.0) == 25.0


def test_fit_recovers_a_and_b() -> None:
    fit = ServiceFit()
    for n in (1, 4, 2, 8, 3, 6):
        fit.add(n, 20.0 + 5.0 * n)
    a, b = fit.coefficients() or (0.0, 0.0)
    assert a == pytest.approx(20.0)
    assert b == pytest.approx(5.0)
    assert fit.spread_ms() == pytest.approx(0.0, abs=1e-6)
    assert fit.predict(10) == pytest.approx(70.0)


def test_fit_with_one_batch_size_is_pessimistic() -> None:
    fit = ServiceFit()
    for _ in range(5):
        fit.add(2, 30.0)
    assert fit.coefficients() is None
    assert fit.predict(4) == pytest.approx(60.0)  # in proportion
    assert fit.predict(1) == pytest.approx(30.0)  # as much


def test_a_fit_of_one_batch_size_follows_that_size_s_time_and_keeps_the_slope() -> None:
    fit = ServiceFit()
    for n in (1, 2, 1, 2, 1, 2):  # fitted while the workers were crowded: 40 + 20·n
        fit.add(n, 40.0 + 20.0 * n)
    assert fit.coefficients() == pytest.approx((40.0, 20.0))
    for _ in range(600):  # then only batches of one, on workers that take 45 ms for them
        fit.add(1, 45.0)
    a, b = fit.coefficients() or (0.0, 0.0)
    assert b == pytest.approx(20.0)  # the slope is not measured by batches of one size: the last one stands
    assert fit.predict(1) == pytest.approx(45.0, abs=0.01)  # the level is: 60 ms before the line followed it
    assert fit.spread_ms() < 0.5  # what is left of the old batches' weight (0.99 ** 600)
    for _ in range(600):  # faster than the slope alone allows: a line through the origin
        fit.add(1, 15.0)
    assert fit.coefficients() == pytest.approx((0.0, 15.0), abs=0.2)  # the 45s weigh 0.99 ** 600 yet


def test_rate_meter_follows_a_step_within_its_window() -> None:
    meter = RateMeter(bin_s=0.05, window_s=0.5)
    t = 100.0
    for _ in range(100):  # 100 req/s for a second
        t += 0.01
        meter.arrive(t)
    assert meter.rate(t) == pytest.approx(100.0, rel=0.1)
    for _ in range(250):  # then 500 req/s
        t += 0.002
        meter.arrive(t)
    assert meter.rate(t) == pytest.approx(500.0, rel=0.1)
    assert meter.rate(t + 2.0) == 0.0


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"slo": {"p99_ms": 100}, "bounds": {"batch_size": [0, 8]}}, "controller.bounds.batch_size"),
        ({"slo": {"p99_ms": 100}, "bounds": {"batch_size": [8, 4]}}, "controller.bounds.batch_size"),
        ({"slo": {"p99_ms": 100}, "bounds": {"workers": [1, 99]}}, "controller.bounds.workers"),
        ({"slo": {"p99_ms": -1}}, "controller.slo.p99_ms"),
        ({"slo": {"p99_ms": 100, "p95_ms": 50}}, "controller.slo"),
        ({"slo": {"p99_ms": 100}, "policy": "magic"}, "controller.policy"),
        ({"slo": {"p99_ms": 100}, "shed": "yes"}, "controller.shed"),
        ({"slo": {"p99_ms": 100}, "bounds": {"cores": [1, 2]}}, "controller.bounds.cores"),
        ({"slo": {"p99_ms": 100}, "policy": "oracle"}, "controller.phases"),
    ],
)
def test_invalid_settings_name_the_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace(".", r"\.")):
        parse_settings(raw, max_workers=8)


def _view(
    now: float,
    rate: float,
    knobs: Knobs,
    fit: ServiceFit,
    settings_raw: dict[str, object],
    margin_ms: float = 0.0,
    reserve: int = 0,
) -> View:
    settings = parse_settings(settings_raw)
    return View(now, now, rate, 0, 0, knobs, settings, fit, margin_ms, reserve=reserve)


def _exact_fit(sizes: tuple[int, ...] = (1, 4, 2, 8, 3, 6, 12)) -> ServiceFit:
    fit = ServiceFit()
    for n in sizes:
        fit.add(n, 20.0 + 5.0 * n)
    return fit


def test_slo_policy_meets_a_step_at_once_and_steps_back_only_after_holding() -> None:
    raw: dict[str, object] = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 32], "workers": [1, 4]}}
    fit = _exact_fit()  # batches up to 12 measured: the cap may go to 24
    policy = make_policy(parse_settings(raw), Knobs(15, 0.0, 1))
    low = Knobs(15, 0.0, 1)  # 15: the SLA's largest batch on one worker, no delay
    assert policy.decide(_view(0.0, 20.0, low, fit, raw)) is None
    step = policy.decide(_view(1.0, 200.0, low, fit, raw))
    assert step is not None and step.knobs == Knobs(22, 0.0, 2)  # at the next tick: 200 / 126.3 -> 2 workers
    assert step.why["margin_ms"] == 0.0 and step.why["law"]["worst_ms"] == pytest.approx(1.5 * (20 + 5 * 22))
    high = step.knobs
    assert policy.decide(_view(1.1, 200.0 * 1.05, high, fit, raw)) is None  # no flap
    # the load fell: the second worker is held for WORKERS_HOLD_S, and after HOLD_S in reserve (the law would want
    # one even at DEADBAND more load), with the one collecting worker's cap (22 on its own: 2 (20 + 110) = 260 ms)
    assert policy.decide(_view(2.0, 20.0, high, fit, raw)) is None
    assert policy.decide(_view(2.0 + HOLD_S / 2, 20.0, high, fit, raw)) is None
    fell = policy.decide(_view(2.0 + HOLD_S, 20.0, high, fit, raw))
    assert fell is not None and fell.reserve == 1 and fell.knobs == Knobs(15, 0.0, 2) and fell.why["reserve"] == 1
    held = fell.knobs
    assert policy.decide(_view(2.0 + WORKERS_HOLD_S / 2, 20.0, held, fit, raw, reserve=1)) is None
    back = policy.decide(_view(2.0 + WORKERS_HOLD_S, 20.0, held, fit, raw, reserve=1))
    assert back is not None and back.knobs == low and back.reserve == 0  # ... for WORKERS_HOLD_S
    # the load back within the hold: the reserve collects again at once, with the cap of two
    policy.decide(_view(3.0 + WORKERS_HOLD_S, 200.0, low, fit, raw))
    policy.decide(_view(4.0 + WORKERS_HOLD_S, 20.0, high, fit, raw))
    again = policy.decide(_view(5.0 + WORKERS_HOLD_S, 200.0, held, fit, raw, reserve=1))
    assert again is not None and again.knobs == high and again.reserve == 0


def test_a_climbing_rate_raises_the_cap_before_the_load_needs_all_of_it() -> None:
    # a = 25, b = 2.5 on two workers, SLA 100 (cap 16): the batch the load needs passes 8 above 284 req/s, and at 15%
    # more load (DEADBAND) above 247. The rate climbs 10 req/s a tick from 200: the cap goes up at 250, where the
    # load alone would have waited for 290 (until then only after HOLD_S of asking)
    raw: dict[str, object] = {"slo": {"p99_ms": 100}, "bounds": {"batch_size": [1, 32], "workers": [2, 2]}}
    fit = ServiceFit()
    for i in range(60):
        fit.add(1 + i % 8, 25.0 + 2.5 * (1 + i % 8))
    assert batch_needed(Cost(25.0, 2.5), 284.0, 2) == 8 and batch_needed(Cost(25.0, 2.5), 285.0, 2) == 9
    assert batch_needed(Cost(25.0, 2.5), 1.15 * 247.0, 2) == 8 and batch_needed(Cost(25.0, 2.5), 1.15 * 248.0, 2) == 9
    policy = make_policy(parse_settings(raw), Knobs(8, 0.0, 2))
    knobs, changes = Knobs(8, 0.0, 2), []
    for tick in range(11):
        decision = policy.decide(_view(tick * 0.1, 200.0 + 10.0 * tick, knobs, fit, raw))
        if decision is not None and decision.knobs != knobs:
            changes.append((200 + 10 * tick, decision.knobs.batch_size))
            knobs = decision.knobs
    assert changes == [(250, 16)], changes


def test_the_workers_15_percent_more_load_would_need_start_now_in_reserve() -> None:
    # a = 25, b = 2.5, SLA 100, no margin: two workers at cap 16 carry 0.8 x 2 x 16 / 65 ms = 394 req/s. At 350 req/s
    # the law holds two; 15% more (402) would need a third: it starts now, held in reserve while two carry the load
    raw: dict[str, object] = {"slo": {"p99_ms": 100}, "bounds": {"batch_size": [1, 32], "workers": [1, 4]}}
    fit = ServiceFit()
    for i in range(60):
        fit.add(1 + i % 8, 25.0 + 2.5 * (1 + i % 8))
    assert decide(Cost(25.0, 2.5), 350.0, 100.0, 0.0, (1, 16), (0, 0), (1, 4)).knobs == Knobs(16, 0.0, 2)
    policy = make_policy(parse_settings(raw), Knobs(16, 0.0, 2))
    decision = policy.decide(_view(0.0, 350.0, Knobs(16, 0.0, 2), fit, raw))
    assert decision is not None and decision.knobs == Knobs(16, 0.0, 3) and decision.reserve == 1
    assert decision.why["headroom"] == {"workers": 3}
    # at 300 req/s (345 with the headroom) two are enough: nothing changes
    assert (
        make_policy(parse_settings(raw), Knobs(16, 0.0, 2)).decide(_view(0.0, 300.0, Knobs(16, 0.0, 2), fit, raw))
        is None
    )


def _after_the_load_falls(
    raw: dict[str, object], start: Knobs, fit: ServiceFit
) -> tuple[Knobs, list[tuple[float, Knobs, int]]]:
    """The policy's decisions, tick by tick, at 30 req/s for 2 s and then 6 req/s until the workers' hold has run
    out: the knobs at the end and each decision (time, knobs, reserve)."""
    policy = make_policy(parse_settings(raw), start)
    knobs, reserve, decisions = start, 0, []
    for tick in range(int((2.0 + WORKERS_HOLD_S + 1.0) / 0.1)):
        now = tick * 0.1
        decision = policy.decide(_view(now, 30.0 if now < 2.0 else 6.0, knobs, fit, raw, reserve=reserve))
        if decision is not None:
            decisions.append((round(now, 1), decision.knobs, decision.reserve))
            knobs, reserve = decision.knobs, decision.reserve
    return knobs, decisions


def test_no_worker_is_held_in_reserve_while_the_law_s_batches_are_of_one() -> None:
    # a model with no batching to speak of (2 + 50n ms) at 4x its batch of one: after the load falls the second
    # worker waits out WORKERS_HOLD_S, collecting (before: in reserve after HOLD_S, where it made requests wait for
    # no larger batch), and the workers go down to one after the hold
    raw: dict[str, object] = {"slo": {"p99_ms": 195}, "bounds": {"batch_size": [1, 8], "workers": [1, 2]}}
    fit = ServiceFit()
    for i in range(60):
        fit.add(1 + i % 2, 2.0 + 50.0 * (1 + i % 2))
    knobs, decisions = _after_the_load_falls(raw, Knobs(1, 0.0, 2), fit)
    assert all(r == 0 for _, _, r in decisions), decisions
    assert knobs == Knobs(1, 0.0, 1)
    assert len(decisions) == 1 and decisions[0][0] >= 2.0 + WORKERS_HOLD_S


def _linear_fit(a_ms: float, b_ms: float) -> ServiceFit:
    fit = ServiceFit()
    for i in range(60):
        fit.add(1 + i % 4, a_ms + b_ms * (1 + i % 4))
    return fit


def test_a_batching_gain_fitted_about_the_floor_does_not_flip_the_cap() -> None:
    # t(n) = a + 45n on two workers, SLA 220 (1.5 t(3) = 215 + 2 fits, t(4) does not): batches of 3 gain 12% at
    # a = 8.6, 8% at a = 5.6, 2% at a = 1. At 20 req/s the load needs batches of one. The fit moves between 12% and
    # 8% every 3 s (resnet18's batches of 2-4 gain 9-14% on a CPU core, as the fit has them from batch to batch)
    raw: dict[str, object] = {"slo": {"p99_ms": 220}, "bounds": {"batch_size": [1, 8], "workers": [2, 2]}}
    high, low, none = _linear_fit(8.6, 45.0), _linear_fit(5.6, 45.0), _linear_fit(1.0, 45.0)
    assert batching_gain(Cost(*high.coefficients() or (0, 0)), 3) == pytest.approx(0.12, abs=0.002)
    assert batching_gain(Cost(*low.coefficients() or (0, 0)), 3) == pytest.approx(0.08, abs=0.002)
    policy = make_policy(parse_settings(raw), Knobs(1, 0.0, 2))
    knobs, changes = Knobs(1, 0.0, 2), []
    phases = [low] * 2 + [high, low] * 5 + [none] * 2  # 3 s each
    for tick in range(int(3.0 * len(phases) / 0.1)):
        now = tick * 0.1
        decision = policy.decide(_view(now, 20.0, knobs, phases[int(now / 3.0)], raw))
        if decision is not None and decision.knobs != knobs:
            changes.append((round(now, 1), decision.knobs.batch_size))
            knobs = decision.knobs
    # 8% does not start batching (6 s), 12% does after the hold; 8% then keeps it (GAIN_KEPT 5%) where one floor
    # took the cap back to 1 after each 8% phase's hold (11 changes); 2% ends it
    assert [size for _, size in changes] == [3, 1], changes
    assert 6.0 + HOLD_S <= changes[0][0] < 9.0 and changes[1][0] >= 36.0 + HOLD_S


def test_no_worker_is_held_in_reserve_while_the_law_s_batches_carry_little_more() -> None:
    # t(n) = 5.6 + 45n, SLA 200: one worker's cap is 2 (2 t(2) = 191 + 2 fits), two workers' too (1.5 t(3) = 211
    # does not), and pairs carry 5.9% more than batches of one: batching, once on, stays on (GAIN_KEPT 5%), but a
    # reserve would only make a request behind the busy worker wait a pair's 96 ms; after the load falls both collect
    # until the workers go to one (before: the second in reserve after HOLD_S)
    raw: dict[str, object] = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 8], "workers": [1, 2]}}
    fit = _linear_fit(5.6, 45.0)
    assert 0.05 < batching_gain(Cost(*fit.coefficients() or (0, 0)), 2) < 0.10
    knobs, decisions = _after_the_load_falls(raw, Knobs(2, 0.0, 2), fit)
    assert all(r == 0 for _, _, r in decisions), decisions
    assert knobs.workers == 1 and decisions[-1][0] >= 2.0 + WORKERS_HOLD_S


def test_a_rate_wobbling_about_the_line_between_two_counts_moves_no_worker_into_reserve() -> None:
    # a = 20, b = 5, SLA 200: one worker at cap 15 carries 0.8 x 15 / 95 ms = 126 req/s. The rate steps between 120
    # and 135 every 0.3 s for 30 s: the law asks for one worker and two by turns; 120 is within DEADBAND of the line,
    # so the second keeps collecting (no reserve, no cap moved back and forth), and it never retires
    raw: dict[str, object] = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 32], "workers": [1, 4]}}
    fit = _exact_fit()
    policy = make_policy(parse_settings(raw), Knobs(22, 0.0, 2))
    knobs, reserve, changes = Knobs(22, 0.0, 2), 0, 0
    for tick in range(300):
        rate = 120.0 if (tick // 3) % 2 else 135.0
        decision = policy.decide(_view(tick * 0.1, rate, knobs, fit, raw, reserve=reserve))
        if decision is not None:
            knobs, reserve, changes = decision.knobs, decision.reserve, changes + 1
        assert knobs.workers == 2 and reserve == 0, (tick, knobs, reserve)
    assert changes <= 1  # at most the cap grown once


def test_before_b_is_told_workers_follow_the_load_as_if_a_batch_cost_its_size() -> None:
    # batches of one only, 25 ms each (b not told): each worker carries 0.8 / 25 ms = 32 req/s if nothing batches
    raw: dict[str, object] = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 32], "workers": [1, 4]}}
    fit = ServiceFit()
    for _ in range(5):
        fit.add(1, 25.0)
    # the cap: the largest batch safe if a batch cost its size, 2 x 25n <= 198 -> 3
    policy = make_policy(parse_settings(raw), Knobs(3, 0.0, 1))
    one = Knobs(3, 0.0, 1)
    assert policy.decide(_view(0.0, 20.0, one, fit, raw)) is None  # 20 req/s: one worker holds it
    up = policy.decide(_view(0.1, 70.0, one, fit, raw))  # 70 x 0.025 / 0.8 = 2.19: three workers, at once
    assert up is not None and up.knobs == Knobs(3, 0.0, 3)
    assert up.why["uncalibrated"]["workers"] == 3
    queued = View(0.2, 0.2, 70.0, 40, 40, up.knobs, parse_settings(raw), fit, 0.0)  # a backlog is load too
    more = policy.decide(queued)
    assert more is not None and more.knobs.workers == 4  # (70 + 40) x 0.025 / 0.8 = 3.4, within the bounds' 4
    assert policy.decide(_view(0.3, 5.0, more.knobs, fit, raw)) is None  # never fewer before b is told
    # held workers (no bounds.workers): the guess moves nothing
    held: dict[str, object] = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 32]}}
    policy = make_policy(parse_settings(held), Knobs(3, 0.0, 1))
    assert policy.decide(_view(0.0, 500.0, one, fit, held)) is None


def test_measured_bounds_keep_the_cap_within_twice_the_largest_batch_seen() -> None:
    assert measured_bounds((1, 32), 2) == (1, 4)
    assert measured_bounds((1, 32), 0) == (1, 2)  # nothing seen: as if batches of one
    assert measured_bounds((1, 32), 20) == (1, 32)  # the bounds still hold
    assert measured_bounds((8, 32), 2) == (8, 8)  # never under the bounds' low end


def test_b_stderr_and_the_cautious_line_by_hand() -> None:
    fit = ServiceFit(decay=1.0)  # no forgetting: plain least squares
    for n, t in ((1, 20.0), (1, 30.0), (3, 40.0), (3, 50.0)):
        fit.add(n, t)
    # n̄ = 2, t̄ = 35, Σ(n - n̄)² = 4, Σ(n - n̄)(t - t̄) = 40: b = 10, a = 15; residuals ±5: σ² = 25 over 4 batches,
    # corrected for two parameters: 25 · 4 / 2 = 50; se(b) = sqrt(50) · sqrt(4) / 4 = 3.536
    assert fit.coefficients() == pytest.approx((15.0, 10.0))
    assert fit.b_stderr() == pytest.approx(50**0.5 / 2)
    a, b = fit.cautious() or (0.0, 0.0)
    assert b == pytest.approx(10.0 + 2 * 50**0.5 / 2)  # b + 2 se: 17.07
    assert a + b * 2 == pytest.approx(35.0)  # turned about the batches' mean (2, 35 ms)
    assert fit.largest == 3
    exact = _exact_fit()
    assert exact.b_stderr() == pytest.approx(0.0, abs=1e-6)  # no residual: the cautious line is the fit
    assert exact.cautious() == pytest.approx((20.0, 5.0))


def test_a_fit_from_batches_of_one_and_two_cannot_put_the_cap_at_its_bound() -> None:
    # at low load the batches are of one request and now and then two; the batch times' noise puts b near 0
    # (here: 26 ms for one, 26.5 ms for two): taken at its word the law's cap runs to the bound, 32
    fit = ServiceFit()
    for i in range(40):
        fit.add(1, 26.0 if i % 2 else 27.0)
        if i % 10 == 9:
            fit.add(2, 26.5)
    a, b = fit.coefficients() or (0.0, 0.0)
    assert b < 0.5
    assert decide(Cost(a, b), 20.0, 200.0, 0.0, (1, 32), (0, 100), (1, 1)).knobs.batch_size == 32
    raw: dict[str, object] = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 32], "workers": [1, 1]}}
    policy = make_policy(parse_settings(raw), Knobs(4, 0.0, 1))
    # the policy: within 2 x the largest batch seen (2), and b at its upper bound: 4 stands, for as long as it asks
    for tick in range(50):
        assert policy.decide(_view(tick * 0.1, 20.0, Knobs(4, 0.0, 1), fit, raw)) is None


def test_the_cap_holds_while_the_margin_wobbles_and_moves_once_the_law_persists() -> None:
    # one worker, SLA 240: the cap is floor(((238 - m) / 2 - 20) / 5): m = 20 -> 17, 50 -> 14, 60 -> 13
    raw: dict[str, object] = {"slo": {"p99_ms": 240}, "bounds": {"batch_size": [1, 32], "workers": [1, 1]}}
    fit = _exact_fit((1, 4, 2, 8, 3, 6, 16))
    policy = make_policy(parse_settings(raw), Knobs(17, 0.0, 1))
    at17 = Knobs(17, 0.0, 1)
    for tick in range(100):  # ten seconds of a margin swinging 50 <-> 20 ms every half second: the cap stays
        margin = 20.0 if (tick // 5) % 2 else 50.0
        assert policy.decide(_view(tick * 0.1, 20.0, at17, fit, raw, margin)) is None
    # then 50-60 ms for HOLD_S without a break: down, to the least change asked (14), not the most (13)
    t = 10.0
    for i in range(round(HOLD_S / 0.1)):
        assert policy.decide(_view(t + i * 0.1, 20.0, at17, fit, raw, 60.0 if i == 3 else 50.0)) is None
    down = policy.decide(_view(t + HOLD_S, 20.0, at17, fit, raw, 50.0))
    assert down is not None and down.knobs == Knobs(14, 0.0, 1)
    # up again (the margin back at 20 ms) waits as long at low load ...
    at14 = down.knobs
    assert policy.decide(_view(20.0, 20.0, at14, fit, raw, 20.0)) is None
    assert policy.decide(_view(20.0 + HOLD_S / 2, 20.0, at14, fit, raw, 20.0)) is None
    # ... but not when the load needs a larger batch: at 130 req/s n >= 0.02·130 / (0.8 - 0.65) = 17.3: 17 at once
    up = policy.decide(_view(20.0 + HOLD_S / 2 + 0.1, 130.0, at14, fit, raw, 20.0))
    assert up is not None and up.knobs == at17
    # a cap predicted to miss the SLA even with no margin (30: 2 (20 + 150) = 340 > 238) comes down at once
    cut = policy.decide(_view(30.0, 20.0, Knobs(30, 0.0, 1), fit, raw, 20.0))
    assert cut is not None and cut.knobs == at17


# ---- threads per worker (bounds.threads) ------------------------------------------------------------------------


def _known(a: float, b: float) -> ThreadCost:
    return ThreadCost(Cost(a, b), Cost(a, b), (1, 32))


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        # 1 thread, 40 + 10n; 2 threads, 24 + 6n; SLA 120, margin 10 -> budget 108; 2 cores
        # 10 req/s: one worker, one thread: 2 (40 + 10n) <= 108 -> 1, worst 100; 1 / 50 ms x 0.8 = 16 req/s holds it
        (10.0, Knobs(1, 0.0, 1, 1)),
        # 50 req/s: 2 x 1 (1.5 (40 + 10n) <= 108 -> 3, 2 x 3 / 70 ms x 0.8 = 68.6 req/s) and 1 x 2 (2 (24 + 6n) <=
        # 108 -> 5, 5 / 54 ms x 0.8 = 74.1 req/s) both hold it on 2 cores: the fewer threads
        (50.0, Knobs(3, 0.0, 2, 1)),
        # 72 req/s: 2 x 1 carries 68.6 at most (3 workers would need 3 cores); 1 x 2 carries 74.1
        (72.0, Knobs(5, 0.0, 1, 2)),
    ],
)
def test_threads_the_fewest_cores_that_hold_the_load_inside_the_sla(rate: float, expected: Knobs) -> None:
    costs = {1: _known(40.0, 10.0), 2: _known(24.0, 6.0)}
    result = decide_threads(costs, rate, 120.0, 10.0, (0, 0), (1, 4), cores=2)
    assert result.knobs == expected
    assert result.feasible and result.worst_ms <= 108.0


def test_threads_where_one_thread_cannot_meet_the_sla_at_all() -> None:
    # 1 thread: a batch of one takes 110 ms, and waits for one more: 220 > 138 (SLA 150, margin 10), and 2 workers
    # 1.5 x 110 = 165 miss too; 2 threads (55 + 5n): 2 (55 + 5n) <= 138 -> 2, worst 130
    costs = {1: _known(100.0, 10.0), 2: _known(55.0, 5.0)}
    result = decide_threads(costs, 5.0, 150.0, 10.0, (0, 0), (1, 2), cores=2)
    assert result.knobs == Knobs(2, 0.0, 1, 2)
    # with one core only one thread fits: the least bad (the smallest worst case), and the law says it cannot hold
    alone = decide_threads(costs, 5.0, 150.0, 10.0, (0, 0), (1, 2), cores=1)
    assert alone.knobs.threads == 1 and alone.worst_ms == pytest.approx(220.0)


def test_a_thread_count_not_measured_is_guessed_on_the_slow_side() -> None:
    assert rescaled(Cost(20.0, 4.0), 1, 2) == Cost(pytest.approx(20.0 / 2**0.5), pytest.approx(4.0 / 2**0.5))
    assert rescaled(Cost(20.0, 4.0), 2, 1) == Cost(40.0, 8.0)  # fewer: in full proportion
    assert rescaled(Cost(20.0, 4.0), 1, 4) == Cost(10.0, 2.0)
    fits = {1: ServiceFit()}
    for n in (1, 2, 3, 4) * 5:
        fits[1].add(n, 40.0 + 10.0 * n)
    guess = thread_cost(fits, 2, (1, 32))
    assert guess is not None
    assert (guess.cost.a_ms, guess.cost.b_ms) == (pytest.approx(40 / 2**0.5), pytest.approx(10 / 2**0.5))
    assert guess.batch_bounds == (1, 8)  # within twice the largest batch measured at any count
    # batches of one at 2 threads took 30 ms: the guessed line through them, 30 / (28.28 + 7.07) = 0.849 of it
    fits[2] = ServiceFit()
    for _ in range(3):
        fits[2].add(1, 30.0)
    through = thread_cost(fits, 2, (1, 32))
    assert through is not None
    assert (through.cost.a_ms, through.cost.b_ms) == (pytest.approx(24.0), pytest.approx(6.0))
    assert thread_cost({1: ServiceFit()}, 2, (1, 32)) is None  # nothing tells b yet


def test_slo_policy_moves_threads_up_at_once_down_after_holding_and_never_past_the_cores() -> None:
    raw = {
        "slo": {"p99_ms": 150},
        "bounds": {"batch_size": [1, 32], "max_batch_delay_ms": [0, 0], "workers": [1, 2], "threads": [1, 2]},
    }
    settings = parse_settings(raw)
    slow, fast = ServiceFit(), ServiceFit()
    for n in (1, 2, 3) * 10:
        slow.add(n, 100.0 + 10.0 * n)  # 1 thread: a lone request's worst case 220 ms
        fast.add(n, 55.0 + 5.0 * n)  # 2 threads
    fits = {1: slow, 2: fast}
    policy = make_policy(settings, Knobs(4, 0.0, 1, 1))

    def at(now: float, knobs: Knobs, rate: float) -> View:
        return View(now, now, rate, 0, 0, knobs, settings, fits[knobs.threads], 0.0, fits=fits, cores=2)

    up = policy.decide(at(0.0, Knobs(4, 0.0, 1, 1), 5.0))
    # at once: 2 threads, one worker (2 x 2 would need 4 cores), 2 (55 + 5n) <= 148 -> 3
    assert up is not None and up.knobs == Knobs(3, 0.0, 1, 2)
    assert up.why["threads"] == {"1": [100.0, 10.0], "2": [55.0, 5.0]}
    # two workers held (say by hand) beside 2 threads: the threads come down at once to fit the cores
    held = policy.decide(at(1.0, Knobs(3, 0.0, 2, 2), 5.0))
    assert held is not None and held.knobs.threads == 1 and held.knobs.workers == 2
    # the law asks for fewer threads (a cost at 2 threads no better than at 1): only after HOLD_S
    same = {1: slow, 2: slow}
    view = View(2.0, 2.0, 5.0, 0, 0, Knobs(3, 0.0, 1, 2), settings, slow, 0.0, fits=same, cores=2)
    assert policy.decide(view).knobs.threads == 2  # type: ignore[union-attr]
    later = View(2.0 + HOLD_S, 2.0 + HOLD_S, 5.0, 0, 0, Knobs(3, 0.0, 1, 2), settings, slow, 0.0, fits=same, cores=2)
    assert policy.decide(later).knobs.threads == 1  # type: ignore[union-attr]


def test_slo_policy_without_thread_bounds_leaves_threads_as_they_are() -> None:
    settings = parse_settings({"slo": {"p99_ms": 150}, "bounds": {"workers": [1, 2]}})
    fit = ServiceFit()
    for n in (1, 2, 3) * 10:
        fit.add(n, 100.0 + 10.0 * n)
    decision = make_policy(settings, Knobs(4, 0.0, 1)).decide(
        View(0.0, 0.0, 5.0, 0, 0, Knobs(4, 0.0, 1), settings, fit, 0.0, cores=2)
    )
    assert decision is not None and decision.knobs.threads == 0 and "threads" not in decision.why
