"""What is measured on this machine before the first trial: an SLA relative to the machine, a trace's scale.

- **An SLA sized to this machine** (``sla: {p99_ms: 3x}``, ``--sla-p99 3x``): the default config (1 worker,
  batch 1) is loaded by one client for about 5 s, and for 10 requests at least (a slow model's single request can
  take seconds on a busy machine: a median of one or two would be chance; 3 at least when 10 would take over 30 s);
  its median latency is the
  single-request latency (measured again, as a trial is, when other processes disturbed it), and each
  relative limit becomes that multiple of it ("SLA for this machine: P99 <= 3 x the single-request latency (412 ms)
  = 1236 ms"). A machine twice as slow, or one with a core taken by another process, gets an SLA twice as loose:
  the study asks what batching and workers buy *here*, not whether this machine is as fast as another.
- **A trace at a share of this server's capacity** (``load.capacity_fraction``): the default config's capacity is
  measured (``bench.fit``) and the trace's peak scaled to that share of it, once for the whole study, so that every
  config replays the same requests.

Both are written to ``calibration.json`` in the study folder and read back when the same study resumes, so a
resumed study judges its earlier trials by the same SLA.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servetune.bench import run_bench
from servetune.bench.fit import fit, measure_capacity
from servetune.bench.schedule import Schedule
from servetune.bench.traces import read_trace
from servetune.tune.study import Study

_LABEL = {"p99_ms": "P99", "p95_ms": "P95", "mean_ms": "mean"}
CALIBRATION_S = 5.0  # the single-client run: about this long, and MIN_REQUESTS requests at least...
MIN_REQUESTS, MAX_REQUESTS = 10, 200
PATIENCE_S = 30.0  # ... unless that takes longer than this: then fewer, 3 at the least


class Calibrator:
    """Runs the measurements above with the trial runner's target and measurer (``runner``: a ``TrialRunner``)."""

    def __init__(self, study: Study, runner: Any, out_dir: Path, say: Callable[[str], None]) -> None:
        self.study = study
        self.runner = runner
        self.path = out_dir / "calibration.json"
        self.say = say
        self.fingerprint = study.fingerprint()
        self.saved: dict[str, Any] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                data = {}
            if isinstance(data, dict) and data.get("fingerprint") == self.fingerprint:
                self.saved = data

    def _save(self, key: str, value: Any) -> None:
        self.saved[key] = value
        self.path.write_text(json.dumps({**self.saved, "fingerprint": self.fingerprint}, indent=2) + "\n")

    def sla(self) -> tuple[Study, str | None]:
        """The study with its relative limits resolved, and the sentence that says how (None: nothing relative)."""
        study = self.study
        if not study.sla_scale:
            return study, None
        saved = self.saved.get("single_request_ms")
        if saved is None:
            single, contended = self._single_request()
            self._save("single_request_ms", single)
            self._save("contended", contended)
        else:
            single, contended = float(saved), bool(self.saved.get("contended"))
        limits = {key: round(multiple * single, 1) for key, multiple in study.sla_scale}
        sla = dataclasses.replace(study.sla, **limits)
        parts = [
            f"{_LABEL[key]} <= {multiple:g} x the single-request latency ({single:.0f} ms) = {limits[key]:g} ms"
            for key, multiple in study.sla_scale
        ]
        sentence = "SLA for this machine: " + "; ".join(parts) + " (the default config, one client, median)"
        if contended:
            sentence += "; other processes were using the machine while it was measured"
        if saved is not None:
            sentence += " (measured when this study started)"
        self.study = dataclasses.replace(study, sla=sla)
        return self.study, sentence

    def _single_request(self) -> tuple[float, bool]:
        study, runner = self.study, self.runner
        point = study.baseline
        runner.start()
        runner.configure(point)
        base = dataclasses.replace(runner.measurer.spec(point, concurrency=1), slo=None, duration=None, requests=2)
        probe = run_bench(base)  # how long one takes (the study's warm-up first)
        each_s = probe.latency.mean_ms / 1000.0 if probe.latency is not None else 1.0
        each_s = max(each_s, 1e-3)
        least = min(MIN_REQUESTS, max(3, int(PATIENCE_S / each_s)))
        count = int(min(MAX_REQUESTS, max(least, CALIBRATION_S / each_s)))
        spec = dataclasses.replace(base, requests=count, warmup_requests=0, warmup_seconds=0.0)
        runs = []
        for _ in range(1 + study.contention.retries):  # a disturbed measurement is taken again, as a trial's is
            runs.append(run_bench(spec))
            if not runs[-1].contended:
                break
        result = min(runs, key=lambda r: r.host.others_cores if r.host is not None else 0.0)
        if result.latency is None:
            from servetune._exceptions import BenchError

            raise BenchError(f"calibration: no request to the default config succeeded ({result.errors})")
        return result.latency.p50_ms, result.contended

    def schedule(self) -> Schedule | None:
        """A trace load's schedule, scaled as the study says (None for other loads)."""
        load = self.study.families[0].load
        if load.mode != "trace" or load.trace is None:
            return None
        schedule = read_trace(load.trace, load.trace_format, dict(load.trace_options))
        if load.time_scale != 1.0:
            schedule = schedule.time_scaled(load.time_scale)
        if load.rate_scale != 1.0:
            schedule = schedule.rate_scaled(load.rate_scale)
        if load.capacity_fraction is not None:
            capacity = self.saved.get("capacity_rps")
            if capacity is None:
                point = self.study.baseline
                self.runner.start()
                self.runner.configure(point)
                measured = measure_capacity(self.runner.measurer.spec(point, concurrency=1))
                self.say(f"capacity of the default config: {measured.describe()}")
                capacity = measured.rps
                self._save("capacity_rps", capacity)
            schedule = fit(schedule, float(capacity), load.capacity_fraction)
        for note in schedule.notes:
            self.say(note)
        self.say(
            f"trace {schedule.name}: {len(schedule)} requests over {schedule.duration_s:.1f} s "
            f"(mean {schedule.mean_rps:.1f} req/s, peak {schedule.peak_rps():.1f} req/s), the same for every config"
        )
        return schedule
