"""The baselines behind the controller's interface, and the decision log's rotation, on hand-made observations."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from servetune._exceptions import ApiError
from servetune.control import BatchSeen, Controller, Decision, Knobs, View, decisions, make_policy, parse_settings
from servetune.control.controller import MIN_SHED_BATCHES, HeldKnobs, late_in_batch
from servetune.control.decisions import DecisionLog
from servetune.control.estimate import ServiceFit, TailMeter
from servetune.control.settings import ControlSettings
from servetune.control.slo_policy import WORKERS_HOLD_S

SLO = {"p99_ms": 100}


def view(raw: dict[str, object], knobs: Knobs, now: float = 0.0, ongoing: int = 0) -> View:
    return View(now, now, 0.0, 0, ongoing, knobs, parse_settings(raw), ServiceFit(), 0.0)


def batch(size: int, actual_ms: float) -> BatchSeen:
    return BatchSeen(size, "full", 0.0, None, actual_ms, "9000")


def test_greedy_takes_the_largest_batch_without_delay() -> None:
    raw = {"slo": SLO, "policy": "greedy", "bounds": {"batch_size": [1, 24]}}
    decision = make_policy(parse_settings(raw), Knobs(4, 10.0, 2)).decide(view(raw, Knobs(4, 10.0, 2)))
    assert decision is not None and decision.knobs == Knobs(24, 0.0, 2)


def test_aimd_grows_by_a_step_after_a_full_batch_inside_and_backs_off_after_a_miss() -> None:
    raw = {"slo": SLO, "policy": "aimd", "bounds": {"batch_size": [1, 32]}}
    policy = make_policy(parse_settings(raw), Knobs(10, 0.0, 1))
    policy.observe(batch(10, 80.0))  # full, inside: 11
    policy.observe(batch(5, 80.0))  # not full: stays
    decision = policy.decide(view(raw, Knobs(10, 0.0, 1)))
    assert decision is not None and decision.knobs.batch_size == 11
    policy.observe(batch(11, 120.0))  # a miss: 11 * 0.9 = 9.9
    decision = policy.decide(view(raw, Knobs(11, 0.0, 1)))
    assert decision is not None and decision.knobs == Knobs(9, 0.0, 1)


def test_queue_scaling_waits_its_delays_before_it_moves_workers() -> None:
    raw = {"slo": SLO, "policy": "queue", "bounds": {"workers": [1, 4]}, "queue": {"upscale_s": 30, "downscale_s": 600}}
    policy = make_policy(parse_settings(raw), Knobs(8, 5.0, 1))
    now = Knobs(8, 5.0, 1)
    assert policy.decide(view(raw, now, 0.0, ongoing=7)) is None  # ceil(7 / 2) = 4 asked ...
    assert policy.decide(view(raw, now, 29.0, ongoing=7)) is None
    up = policy.decide(view(raw, now, 30.0, ongoing=7))  # ... for 30 s
    assert up is not None and up.knobs == Knobs(8, 5.0, 4)
    assert policy.decide(view(raw, up.knobs, 31.0, ongoing=1)) is None  # down only after 600 s
    assert policy.decide(view(raw, up.knobs, 630.0, ongoing=1)) is None
    down = policy.decide(view(raw, up.knobs, 631.0, ongoing=1))
    assert down is not None and down.knobs.workers == 1


def test_oracle_and_static_hold_their_configs() -> None:
    phases = [
        {"until_s": 10, "batch_size": 2, "max_batch_delay_ms": 0, "workers": 1},
        {"until_s": 20, "batch_size": 8, "max_batch_delay_ms": 5, "workers": 2},
    ]
    raw = {"slo": SLO, "policy": "oracle", "phases": phases, "bounds": {"workers": [1, 2]}}
    policy = make_policy(parse_settings(raw), Knobs(1, 0.0, 1))
    first = policy.decide(view(raw, Knobs(1, 0.0, 1), 5.0))
    assert first is not None and first.knobs == Knobs(2, 0.0, 1)
    second = policy.decide(view(raw, first.knobs, 15.0))
    assert second is not None and second.knobs == Knobs(8, 5.0, 2)
    assert policy.decide(view(raw, second.knobs, 99.0)) is None  # the last phase holds after its end
    static = {"slo": SLO, "policy": "static", "static": {"batch_size": 4, "max_batch_delay_ms": 3, "workers": 2}}
    decision = make_policy(parse_settings(static), Knobs(1, 0.0, 1)).decide(view(static, Knobs(1, 0.0, 1)))
    assert decision is not None and decision.knobs == Knobs(4, 3.0, 2)


def test_lsq_sheds_and_holds_batches_for_their_deadline() -> None:
    raw = {"slo": SLO, "policy": "lsq", "bounds": {"batch_size": [1, 16], "max_batch_delay_ms": [0, 40]}}
    policy = make_policy(parse_settings(raw), Knobs(4, 0.0, 2))
    assert policy.shed and policy.deadline_dispatch
    decision = policy.decide(view(raw, Knobs(4, 0.0, 2)))
    assert decision is not None and decision.knobs == Knobs(16, 40.0, 2)


def test_the_decision_log_writes_at_flush_and_bounds_what_waits(tmp_path: Path, monkeypatch) -> None:
    """A batch's line waits for the tick's flush (off the request path), in order with the knob changes; with no
    tick (a loop held up) at most PENDING_MAX records wait before they are written."""
    monkeypatch.setattr(decisions, "PENDING_MAX", 10)
    path = tmp_path / "d.jsonl"
    log = DecisionLog(str(path))
    log.batch(0.1, "w0", "full", 2, 0.5, 1.0, 1.5)
    log.change({"kind": "knobs", "i": 0})
    log.batch(0.2, "w0", "delay", 1, 0.5, None, 1.5)
    assert path.read_text() == ""
    log.flush()
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds == ["batch", "knobs", "batch"]
    for i in range(25):
        log.batch(1.0 + i, "w0", "full", i, 0.5, 1.0, 1.5)
    assert len(path.read_text().splitlines()) == 3 + 20  # two bounded writes; 5 still wait
    log.close()
    assert len(path.read_text().splitlines()) == 3 + 25


def test_the_decision_log_rotates_and_keeps_the_recent_changes(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    log = DecisionLog(str(path), max_bytes=400, keep=2, recent=3)
    for i in range(20):
        log.batch(i / 10, 'w"0', "full", i, 0.5, None if i % 2 else 1.25, 2.5)
    for i in range(5):
        log.change({"kind": "knobs", "i": i})
    log.close()
    assert [r["i"] for r in log.recent] == [2, 3, 4]
    kept = [path, path.with_name("d.jsonl.1"), path.with_name("d.jsonl.2")]
    assert all(p.exists() for p in kept) and not path.with_name("d.jsonl.3").exists()
    assert all(p.stat().st_size <= 400 + 170 for p in kept)  # rotated once past the limit
    last = [json.loads(line) for line in path.read_text().splitlines()]
    assert last[-1] == {"kind": "knobs", "i": 4}
    batches = [json.loads(line) for p in kept for line in p.read_text().splitlines()]
    batches = sorted((r for r in batches if r["kind"] == "batch"), key=lambda r: r["size"])
    assert batches[-1] == {
        "t": 1.9,
        "kind": "batch",
        "worker": 'w"0',
        "reason": "full",
        "size": 19,
        "oldest_queue_ms": 0.5,
        "predicted_ms": None,
        "actual_ms": 2.5,
    }
    assert batches[-2]["predicted_ms"] == 1.25


def test_a_fit_from_a_cold_workers_slow_batches_does_not_shed_an_idle_model() -> None:
    # A fresh worker's first batches of one took 300 ms (a CNN's first forward passes), against an SLA of 100: the
    # fit says every request will be late. Shedding on that when nothing else waits would refuse every request from
    # then on, and no batch would ever correct the fit.
    async def main() -> None:
        model = HeldKnobs(Knobs(1, 0.0, 2))
        controller = Controller("m", "1", parse_settings({"slo": {"p99_ms": 100}, "shed": True}), model)
        for _ in range(MIN_SHED_BATCHES):
            controller.dispatched("w1", 1)
            controller.finished("w1", 1, "solo", 0.0, math.nan, 300.0)
        await controller.tick()
        assert controller.fit.mean() == pytest.approx((1.0, 300.0))
        now = time.monotonic()
        controller.admit(now, None)  # idle: served (its batch corrects the fit)
        controller.dispatched("w1", 1)
        controller.admit(now, None)  # one worker still free, nothing queued: served
        model.queue = 1
        with pytest.raises(ApiError) as queued:  # a request would wait behind another: the prediction decides
            controller.admit(now, None)
        assert queued.value.status == 503
        model.queue = 0
        with pytest.raises(ApiError):  # a client's own deadline of 50 ms is shed even when a worker is free
            controller.admit(now, now + 0.05)
        for _ in range(50):  # warm batches: 40 ms
            controller.dispatched("w1", 1)
            controller.finished("w1", 1, "solo", 0.0, 300.0, 40.0)
        await controller.tick()
        assert controller.fit.mean()[1] < 60.0  # type: ignore[index]
        controller.admit(now, now + 0.1)  # now a client's 100 ms can be met
        assert controller.describe()["shed"] == 2
        await controller.close()

    asyncio.run(main())


def test_a_reserve_worker_is_due_once_the_oldest_waited_past_what_the_law_allows() -> None:
    # a = 25, b = 2.5, SLA 100 (2 ms of slack, no margin): 3 workers at cap 15, one in reserve. Two collecting
    # workers free one every t(15) / 2 = 31.25 ms under load: a batch whose oldest request waited longer is the
    # reserve's, sooner than its deadline dispatch (100 - 2 - t(n)); a small batch's deadline may come first
    async def main() -> None:
        model = HeldKnobs(Knobs(15, 0.0, 3))
        controller = Controller("m", "1", parse_settings({"slo": {"p99_ms": 100}}), model)
        for n in (1, 4, 2, 8, 3, 6, 12, 15):
            controller.dispatched("w1", n)
            controller.finished("w1", n, "full", 0.0, math.nan, 25.0 + 2.5 * n)
        await controller.tick()
        controller.reserve = 1
        assert controller.reserve_by(10.0, 15) == pytest.approx(10.0 + 0.03125)
        assert controller.dispatch_by(10.0, 15) == pytest.approx(10.0 + (98.0 - 62.5) / 1000.0)
        controller.reserve = 2  # one collecting worker: t(15) = 62.5 ms, past the deadline dispatch of 35.5 ms
        assert controller.reserve_by(10.0, 15) == pytest.approx(controller.dispatch_by(10.0, 15))
        await controller.close()

    asyncio.run(main())


def test_before_b_is_told_the_cap_stays_within_what_a_proportional_cost_makes_safe() -> None:
    # Registered at batch 8; the batches seen are all of one request at 40 ms. Until b can be told, a batch of n is
    # taken to cost n * 40 ms: with 2 workers a request may wait for half a batch, so 1.5 * 40 * n <= 200 - 2 gives
    # n = 3 (the registered 8 would have run batches of 5 at ~200 ms); a cost that says 1 still leaves 2.
    raw = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 32], "max_batch_delay_ms": [0, 10]}}
    settings = parse_settings(raw)
    policy = make_policy(settings, Knobs(8, 0.0, 2))
    fit = ServiceFit()
    assert policy.decide(View(0.0, 0.0, 0.0, 0, 0, Knobs(8, 0.0, 2), settings, fit, 0.0)) is None  # as registered
    for _ in range(5):
        fit.add(1, 40.0)
    decision = policy.decide(View(1.0, 1.0, 0.0, 0, 0, Knobs(8, 0.0, 2), settings, fit, 0.0))
    assert decision is not None and decision.knobs == Knobs(3, 0.0, 2)
    assert decision.why == {"uncalibrated": {"per_request_ms": 40.0, "safe_cap": 3}}
    assert policy.decide(View(1.1, 1.1, 0.0, 0, 0, Knobs(3, 0.0, 2), settings, fit, 0.0)) is None
    slow = ServiceFit()
    for _ in range(5):
        slow.add(1, 150.0)
    decision = policy.decide(View(2.0, 2.0, 0.0, 0, 0, Knobs(3, 0.0, 2), settings, slow, 0.0))
    assert decision is not None and decision.knobs.batch_size == 2


# ---- the tail checks the law --------------------------------------------------------------------------------------


def test_late_requests_in_a_batch_by_hand() -> None:
    # limit 98 ms: a batch that ran 64 ms is late for the requests that waited more than 34 ms
    assert late_in_batch(15, 30.0, 64.0, 98.0) == 0  # the oldest waited 30: none
    assert late_in_batch(15, 38.0, 64.0, 98.0) == 2  # 4 ms of its 38 past 34: 15 x 4/38 = 1.6 -> 2
    assert late_in_batch(10, 68.0, 64.0, 98.0) == 5  # half its wait past 34
    assert late_in_batch(3, 1.0, 120.0, 98.0) == 3  # the batch alone ran past the limit: every request
    assert late_in_batch(1, 0.0, 99.0, 98.0) == 1


def test_the_tail_meter_counts_the_last_seconds_and_forgets_on_clear() -> None:
    tail = TailMeter(bin_s=0.5, window_s=5.0)
    tail.add(0.1, 10, 0)
    assert tail.share(0.2) == 0.0  # fewer than 20 answered: no share yet
    tail.add(0.3, 90, 2)
    assert tail.share(0.4) == pytest.approx(0.02)
    tail.add(3.0, 100, 0)
    assert tail.share(3.1) == pytest.approx(0.01)
    assert tail.share(5.6) == 0.0  # the first bin left the window: 100 answered, none late
    tail.add(5.7, 100, 5)
    tail.clear()
    assert tail.share(5.8) == 0.0


def test_the_tail_meter_tells_the_worst_second_of_the_window() -> None:
    tail = TailMeter(bin_s=0.5, window_s=5.0)
    tail.add(0.1, 60, 0)
    tail.add(0.6, 60, 3)  # the second from 0 to 1: 120 answered, 3 late
    for k in range(2, 9):
        tail.add(k * 0.5 + 0.1, 60, 0)
    assert tail.share(4.4) == pytest.approx(3 / 540)  # the window's share: inside a P99's 1%
    assert tail.worst_second(4.4) == pytest.approx(3 / 120)  # its worst second: 2.5%
    assert tail.worst_second(5.4) == pytest.approx(3 / 120)  # 0.5-1.5 s: the late bin and a good one
    assert tail.worst_second(5.8) == 0.0  # the late bin left the window
    tail.add(5.6, 60, 0)
    tail.add(6.0, 50, 5)
    assert tail.worst_second(6.1) == pytest.approx(5 / 110)  # a second with 60 + 50 answers, 5 late
    assert tail.worst_second(6.1, least=200) == 0.0
    tail.clear()
    tail.add(7.0, 50, 5)
    assert tail.worst_second(7.1) == 0.0  # 50 answered in that second: too few to tell a 1% share


def tail_policy(slo: str) -> tuple[ControlSettings, ServiceFit, Any]:
    """a = 20, b = 5, SLA 200 ms (``slo``), workers 1-3: at 100 req/s one worker holds the load (n_need 7 <= cap 15)."""
    raw: dict[str, object] = {"slo": {slo: 200}, "bounds": {"batch_size": [1, 32], "workers": [1, 3]}}
    settings = parse_settings(raw)
    fit = ServiceFit()
    for n in (1, 4, 2, 8, 3, 6, 12):
        fit.add(n, 20.0 + 5.0 * n)
    return settings, fit, make_policy(settings, Knobs(15, 0.0, 1))


def test_late_answers_past_the_slas_share_ask_one_worker_more_and_any_holds_the_workers() -> None:
    # a = 20, b = 5, SLA 200: at 100 req/s one worker holds the load (n_need 7 <= cap 15)
    settings, fit, policy = tail_policy("p99_ms")

    def at(now: float, knobs: Knobs, late: float, rate: float = 100.0, reserve: int = 0) -> View:
        return View(now, now, rate, 0, 0, knobs, settings, fit, 0.0, late_share=late, reserve=reserve)

    one = Knobs(15, 0.0, 1)
    assert policy.decide(at(0.0, one, 0.0)) is None
    assert policy.decide(at(0.1, one, 0.01)) is None  # 1%: inside the P99's share
    up = policy.decide(at(0.2, one, 0.02))  # 2% late: one more worker, at once
    assert up is not None and up.knobs.workers == 2 and up.why["tail"] == {"late_share": 0.02, "workers": 2}
    # the law's one worker collects the batches; the tail's is held in reserve, and the cap stays the law's for one
    assert up.reserve == 1 and up.knobs.batch_size == 15
    two, reserve = up.knobs, up.reserve
    # the law asks for one worker again; a late answer in the window holds two, however long
    for tick in range(300):
        assert policy.decide(at(1.0 + tick * 0.1, two, 0.005, reserve=reserve)) is None
    # none late: the law asks for one worker, but the tail needed two at 100 req/s: held while the rate stays within
    # DEADBAND (15%) of it, however long
    knobs = two
    for tick in range(600):
        decision = policy.decide(at(40.0 + tick * 0.1, knobs, 0.0, 100.0 if tick % 2 else 86.0, reserve))
        if decision is not None:
            knobs, reserve = decision.knobs, decision.reserve
        assert knobs.workers == 2 and reserve == 1
    assert decision is None or "tail_held" in decision.why
    # the rate down past 15% below it: the law's one after WORKERS_HOLD_S (meanwhile the two workers' cap may move),
    # the second held in reserve until then
    tick = 0
    while knobs.workers == 2:
        assert reserve == 1
        decision = policy.decide(at(100.0 + tick * 0.1, knobs, 0.0, 80.0, reserve))
        if decision is not None:
            knobs, reserve = decision.knobs, decision.reserve
        tick += 1
    assert tick * 0.1 == pytest.approx(WORKERS_HOLD_S + 0.1) and reserve == 0
    # ... and forgotten: back at 100 req/s with none late, the law's one worker stays
    assert all(policy.decide(at(130.0 + t * 0.1, knobs, 0.0)) is None for t in range(300))
    # at the bounds' most, late answers hold the workers there are (two of them in reserve)
    three = Knobs(knobs.batch_size, 0.0, 3)
    assert policy.decide(at(170.0, three, 0.5, reserve=2)) is None


def test_a_late_second_asks_one_worker_more_though_the_window_is_inside() -> None:
    # the same model and load as above: 0.5% late over 5 s is inside the P99's 1%, but one second of it had 2%
    settings, fit, policy = tail_policy("p99_ms")
    one = Knobs(15, 0.0, 1)
    inside = View(0.0, 0.0, 100.0, 0, 0, one, settings, fit, 0.0, late_share=0.005, late_second=0.01)
    assert policy.decide(inside) is None
    late = View(0.1, 0.1, 100.0, 0, 0, one, settings, fit, 0.0, late_share=0.005, late_second=0.02)
    up = policy.decide(late)
    assert up is not None and up.knobs.workers == 2
    assert up.why["tail"] == {"late_share": 0.005, "late_second": 0.02, "workers": 2}


def test_the_controller_counts_late_answers_and_forgets_them_when_the_workers_change() -> None:
    async def main() -> None:
        model = HeldKnobs(Knobs(8, 0.0, 1))
        raw = {"slo": {"p99_ms": 100}, "bounds": {"batch_size": [1, 8], "workers": [1, 2]}}
        controller = Controller("m", "1", parse_settings(raw), model)
        for size, queued in ((8, 10.0), (8, 60.0), (4, 0.0), (4, 0.0)):  # 24 answered; 60 + 45 > 98: 8 x 7/60 -> 1
            controller.dispatched("w1", size)
            controller.finished("w1", size, "full", queued, math.nan, 45.0)
        assert controller.view().late_share == pytest.approx(1 / 24)
        assert controller.describe()["lateShare"] == pytest.approx(1 / 24, abs=1e-4)
        assert controller.view().late_second == 0.0  # 24 answers: too few to tell a second's 1%
        for _ in range(10):
            controller.dispatched("w1", 10)
            controller.finished("w1", 10, "full", 0.0, math.nan, 45.0)
        assert controller.view().late_second == pytest.approx(1 / 124)
        assert controller.describe()["lateSecond"] == pytest.approx(1 / 124, abs=1e-4)
        controller.apply(controller.view(), Decision(Knobs(8, 0.0, 2), {}))  # a scale: the tail starts again
        assert controller.view().late_share == 0.0
        await controller.close()

    asyncio.run(main())


@pytest.mark.parametrize(("slo", "late", "workers"), [("p95_ms", 0.02, 1), ("p95_ms", 0.06, 2), ("mean_ms", 0.5, 1)])
def test_the_tail_is_checked_against_the_slas_own_share(slo: str, late: float, workers: int) -> None:
    # a P95 SLA allows 5% late; a mean SLA has no tail to check (the law's one worker holds 100 req/s, as above)
    settings, fit, policy = tail_policy(slo)
    decision = policy.decide(View(0.0, 0.0, 100.0, 0, 0, Knobs(15, 0.0, 1), settings, fit, 0.0, late_share=late))
    assert (decision.knobs.workers if decision is not None else 1) == workers


def test_the_cap_comes_down_at_once_only_on_a_sure_miss_else_after_the_law_asked_for_hold_s() -> None:
    # a = 20, b = 5 (the fit exact: its cautious line is the same), SLA 200, two workers held: at 150 req/s the law's
    # cap is 22 (1.5 (20 + 5n) <= 198)
    raw: dict[str, object] = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 32], "workers": [2, 2]}}
    settings = parse_settings(raw)
    policy = make_policy(settings, Knobs(22, 0.0, 2))

    def fitted(b: float) -> ServiceFit:
        fit = ServiceFit()
        for n in (1, 4, 2, 8, 3, 6, 12, 16):
            fit.add(n, 20.0 + b * n)
        return fit

    def at(now: float, knobs: Knobs, fit: ServiceFit, margin: float) -> View:
        return View(now, now, 150.0, 0, 0, knobs, settings, fit, margin)

    cap22 = Knobs(22, 0.0, 2)
    assert policy.decide(at(0.0, cap22, fitted(5.0), 0.0)) is None
    # the margin up to 30 ms: the law asks for 18 ((168 / 1.5 - 20) / 5), but 22 still fits the SLA with no margin
    # (195 ms): the cap waits HOLD_S (2 s), then takes the least change asked
    ticks = [policy.decide(at(1.0 + t * 0.1, cap22, fitted(5.0), 30.0)) for t in range(21)]
    assert all(d is None for d in ticks[:20])
    down = ticks[20]
    assert down is not None and down.knobs.batch_size == 18
    assert down.why["cap_down"] == {"sure_miss": False, "worst_ms": 195.0, "asked_s": 2.0}
    # the cost up to b = 7: the cap now (18) is a sure miss (1.5 (20 + 7 * 18) = 219 ms > 198): down at once, to 13
    cap18 = down.knobs
    sure = policy.decide(at(3.1, cap18, fitted(7.0), 30.0))
    assert sure is not None and sure.knobs.batch_size == 13
    assert sure.why["cap_down"] == {"sure_miss": True, "worst_ms": 219.0, "asked_s": 0.0}
