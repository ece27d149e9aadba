"""Schedules, synthetic shapes and the trace importers: deterministic, faithful to their formats, loud on bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servetune._exceptions import ConfigError
from servetune.bench import BenchSpec
from servetune.bench.schedule import Schedule, unit_renewal
from servetune.bench.shapes import Burst, Segment, shape
from servetune.bench.traces import TRACE_FORMATS, detect_format, read_trace

SAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces"


def test_steady_schedules_have_the_asked_rate_and_spacing() -> None:
    constant = Schedule.steady(4.0, seconds=1.25)
    assert constant.offsets_s.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    poisson = Schedule.steady(100.0, "poisson", requests=20000, seed=3)
    gaps = np.diff(poisson.offsets_s)
    assert len(poisson) == 20000 and gaps.mean() == pytest.approx(0.01, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps
    bursty = Schedule.steady(100.0, "gamma", requests=20000, cv=2.0, seed=3)
    gaps = np.diff(bursty.offsets_s)
    assert gaps.mean() == pytest.approx(0.01, rel=0.05) and gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.08)
    # The same seed, the same schedule; another seed, another one.
    assert np.array_equal(poisson.offsets_s, Schedule.steady(100.0, "poisson", requests=20000, seed=3).offsets_s)
    assert not np.array_equal(poisson.offsets_s[:50], Schedule.steady(100.0, "poisson", requests=50, seed=4).offsets_s)
    with pytest.raises(ConfigError, match="cv="):
        unit_renewal("gamma", 0.0, 0, 10)


def test_an_open_loop_spec_makes_its_schedule_with_the_warm_up_in_front() -> None:
    spec = BenchSpec(url="http://h:1/p", rate=10.0, duration=2.0, warmup_seconds=1.0)
    offsets = spec.open_schedule().offsets_s
    assert offsets[0] == 0.0 and offsets[-1] >= 3.0 - 1e-9 and np.diff(offsets) == pytest.approx(0.1)
    counted = BenchSpec(url="http://h:1/p", rate=10.0, requests=5, warmup_requests=3)
    assert len(counted.open_schedule()) == 9
    traced = BenchSpec(url="http://h:1/p", schedule=Schedule.steady(5.0, seconds=1.0))
    assert traced.mode == "open" and traced.open_schedule() is traced.schedule
    with pytest.raises(ConfigError, match="schedule and rate"):
        BenchSpec(url="http://h:1/p", rate=1.0, duration=1.0, schedule=Schedule.steady(5.0, seconds=1.0))


def test_shapes_follow_their_rate_curve() -> None:
    step = shape([Segment(20, 20.0), Segment(20, 50.0)], seed=1)
    per_10s = step.counts(10.0) / 10.0
    assert step.duration_s == 40.0 and per_10s == pytest.approx([20, 20, 50, 50], rel=0.2)
    assert step.counts(20.0).tolist()[1] / step.counts(20.0).tolist()[0] == pytest.approx(2.5, rel=0.12)
    day = shape([Segment(100, diurnal=(10.0, 90.0))], process="constant")
    curve = day.counts(10.0)
    assert curve[0] < curve[4] and curve[-1] < curve[5] and int(np.argmax(curve)) in (4, 5)
    assert len(day) == pytest.approx(50 * 100, rel=0.01)  # the mean of the curve is (10 + 90) / 2
    ramp = shape([Segment(10, 0.0, end_rate=100.0)], process="constant")
    assert len(ramp) == pytest.approx(500, abs=1) and ramp.counts(5.0).tolist()[0] == pytest.approx(125, abs=1)
    burst = shape([Segment(30, 10.0, burst=Burst(at_s=10, seconds=5, rate=90.0))], process="constant")
    assert burst.counts(5.0).tolist() == pytest.approx([50, 50, 500, 50, 50, 50], abs=1)
    mixed = shape([Segment(10, 20.0), Segment(10, 20.0, process="gamma", cv=3.0)], seed=2)
    first, second = np.diff(mixed.offsets_s[mixed.offsets_s < 10]), np.diff(mixed.offsets_s[mixed.offsets_s >= 10])
    assert second.std() / second.mean() > 1.6 * first.std() / first.mean()  # the Gamma segment is burstier
    assert np.array_equal(shape([Segment(20, 20.0)], seed=5).offsets_s, shape([Segment(20, 20.0)], seed=5).offsets_s)
    with pytest.raises(ConfigError, match=r"segments\[0\]\.seconds"):
        shape([Segment(0, 1.0)])


def test_scaling_keeps_the_curve() -> None:
    step = shape([Segment(10, 20.0), Segment(10, 50.0)], seed=1)
    fast = step.time_scaled(0.1)
    assert fast.duration_s == pytest.approx(2.0) and len(fast) == len(step)
    more = step.rate_scaled(2.5, seed=3)
    assert len(more) == pytest.approx(2.5 * len(step), rel=0.03)
    assert more.counts(10.0).tolist()[1] / more.counts(10.0).tolist()[0] == pytest.approx(2.5, rel=0.15)
    assert np.all(np.diff(more.offsets_s) >= 0)
    fewer = step.rate_scaled(0.3, seed=3)
    assert len(fewer) == pytest.approx(0.3 * len(step), rel=0.15)
    assert np.array_equal(more.offsets_s, step.rate_scaled(2.5, seed=3).offsets_s)
    both = Schedule.steady(10.0, seconds=1.0).then(Schedule.steady(20.0, seconds=1.0), gap_s=0.5)
    assert len(both) == 30 and both.offsets_s[10] == pytest.approx(1.5) and both.duration_s == pytest.approx(2.5)
    assert len(both.head(seconds=1.0)) == 10 and len(both.between(1.5, 2.0)) == 10


def test_every_sample_trace_is_told_and_read() -> None:
    expected = {
        "step.csv": ("csv", 350, 10.0),
        "azure-functions-2019.csv": ("azure-functions-2019", None, 86400.0),
        "azure-functions-2021.csv": ("azure-functions-2021", 6, 60.0),
        "burstgpt.csv": ("burstgpt", None, None),
        "mooncake.jsonl": ("mooncake", 60, None),
        "step-2.5x.yaml": ("shape", None, 30.0),
        "diurnal.yaml": ("shape", None, 180.0),
    }
    for name, (fmt, count, seconds) in expected.items():
        path = SAMPLES / name
        assert detect_format(path) == fmt, name
        schedule = read_trace(path)
        assert len(schedule) > 0 and schedule.offsets_s[0] >= 0
        if count is not None:
            assert len(schedule) == count, name
        if seconds is not None:
            assert schedule.duration_s == pytest.approx(seconds, rel=0.01), name
    assert set(TRACE_FORMATS) >= {"csv", "jsonl", "perf-analyzer", "azure-functions-2019", "azure-functions-2021",
                                  "burstgpt", "mooncake"}  # fmt: skip


def test_formats_by_hand(tmp_path: Path) -> None:
    # perf_analyzer's documented example: 100000, 200000, 500000 us -> sends at 0.1, 0.3, 0.8 s, looping.
    intervals = read_trace(SAMPLES / "intervals.txt", "perf-analyzer", {"repeat": "2"})
    assert intervals.offsets_s == pytest.approx([0.1, 0.3, 0.8, 0.9, 1.1, 1.6])
    # Azure 2021: arrival = end - duration, shifted to start at 0 (the description's six example rows).
    azure = read_trace(SAMPLES / "azure-functions-2021.csv")
    assert azure.offsets_s == pytest.approx(sorted(t - 5160.008570018768 for t in (
        5160.008570018768, 5161.267997037888, 5199.211729949951, 5211.511348941803, 5219.410173933029,
        5220.0142909832)))  # fmt: skip
    one = read_trace(SAMPLES / "azure-functions-2021.csv", options={"app": "7fa05b"})
    assert len(one) == 1
    # servetune's schema, as CSV and JSONL, with its per-request fields.
    (tmp_path / "t.csv").write_text("t_ms,size,model\n20,5,a\n0,7,b\n")
    rows = read_trace(tmp_path / "t.csv")
    assert rows.offsets_s.tolist() == [0.0, 0.02] and rows.sizes is not None and rows.sizes.tolist() == [7, 5]
    assert rows.models == ("b", "a")
    (tmp_path / "t.jsonl").write_text('{"t_ms": 1500}\n{"t_ms": 500, "stage": "x"}\n')
    with pytest.raises(ConfigError, match="stage is given on some rows only"):
        read_trace(tmp_path / "t.jsonl")
    (tmp_path / "bare.txt").write_text("0\n250\n")
    with pytest.raises(ConfigError, match="--trace-format"):
        read_trace(tmp_path / "bare.txt")
    assert read_trace(tmp_path / "bare.txt", "csv").offsets_s.tolist() == [0.0, 0.25]
    # Mooncake: timestamp in ms, input_length as the size.
    (tmp_path / "m.jsonl").write_text(
        '{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46]}\n'
        '{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": []}\n'
    )
    moon = read_trace(tmp_path / "m.jsonl")
    assert moon.offsets_s.tolist() == [0.0, 10.535] and moon.sizes is not None and moon.sizes.tolist() == [655, 672]
    # BurstGPT: failed rows (0 response tokens) kept or dropped, a model kept.
    all_rows = read_trace(SAMPLES / "burstgpt.csv")
    ok_rows = read_trace(SAMPLES / "burstgpt.csv", options={"failed": "false"})
    gpt4 = read_trace(SAMPLES / "burstgpt.csv", options={"model": "GPT-4"})
    assert len(ok_rows) < len(all_rows) and 0 < len(gpt4) < len(all_rows) and set(gpt4.models or ()) == {"GPT-4"}


def test_azure_2019_synthesises_each_minute_as_counted() -> None:
    path = SAMPLES / "azure-functions-2019.csv"
    timer = read_trace(path, options={"trigger": "timer"})
    assert len(timer) == 12 * 1440 and timer.counts(60.0).tolist() == [12] * 1440
    again = read_trace(path, options={"trigger": "timer"})
    assert np.array_equal(timer.offsets_s, again.offsets_s)  # seeded
    other = read_trace(path, options={"trigger": "timer", "seed": "1"})
    assert not np.array_equal(timer.offsets_s, other.offsets_s)
    bursty = read_trace(path, options={"trigger": "timer", "arrival": "gamma", "cv": "3"})
    assert bursty.counts(60.0).tolist() == [12] * 1440  # the counts hold whatever the process
    gaps, even = np.diff(bursty.offsets_s), np.diff(timer.offsets_s)
    assert gaps.std() > 1.5 * even.std()
    summed = read_trace(path)
    http = read_trace(path, options={"trigger": "http"})
    assert len(summed) > len(http) > 0
    with pytest.raises(ConfigError, match="no row matches function=ffff"):
        read_trace(path, options={"function": "ffff"})
    with pytest.raises(ConfigError, match="option 'funtion' is not one this format reads"):
        read_trace(path, options={"funtion": "ab"})
    with pytest.raises(ConfigError, match="arrival='weibull'"):
        read_trace(path, options={"arrival": "weibull"})


def test_bad_traces_are_refused_with_the_line(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("t_ms\n0\nsoon\n")
    with pytest.raises(ConfigError, match="line 3: t_ms='soon'"):
        read_trace(tmp_path / "a.csv")
    (tmp_path / "i.txt").write_text("100\n-5\n")
    with pytest.raises(ConfigError, match="line 2"):
        read_trace(tmp_path / "i.txt", "perf-analyzer")
    (tmp_path / "s.yaml").write_text("segments:\n  - {seconds: 5, rate: 10, sped: 2}\n")
    with pytest.raises(ConfigError, match=r"segments\[0\]\.sped: unknown key"):
        read_trace(tmp_path / "s.yaml")
    (tmp_path / "e.csv").write_text("t_ms\n")
    with pytest.raises(ConfigError, match="no request in it"):
        read_trace(tmp_path / "e.csv")
    with pytest.raises(ConfigError, match="trace format 'nope'"):
        read_trace(SAMPLES / "step.csv", "nope")
