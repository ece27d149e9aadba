"""The published controllers servetune's is compared with, behind the same interface (``control/policy.py``), so that
one server replays one trace against each in turn:

- ``static``: fixed knobs (``controller.static``; the offline tuner's winner at the trace's mean or peak load);
- ``greedy`` (Triton's dynamic batcher with no queue delay): delay 0, the largest batch the queue holds, up to the
  batch bound's top;
- ``aimd`` (Clipper): the batch cap grows by ``step`` (1) while batches finish inside the SLA, and shrinks by
  ``backoff`` (×0.9) when one does not; no delay;
- ``lsq`` (BentoML's adaptive batcher): a least-squares fit of batch time (the controller's), a batch held while its
  oldest request can still make the SLA, and requests predicted to miss it shed;
- ``queue`` (Ray Serve's autoscaling): workers = ongoing requests / ``target_ongoing`` (2), up after ``upscale_s``
  (30 s) and down after ``downscale_s`` (600 s) of asking, Ray's defaults; batching as registered;
- ``oracle``: the best static config for each phase of the trace, found offline (``controller.phases``).
"""

from __future__ import annotations

import math

from servetune.control.policy import BatchSeen, Decision, View
from servetune.control.settings import ControlSettings, Knobs


class Static:
    name = "static"
    observes = False
    shed = False
    deadline_dispatch = False

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        self.knobs = settings.static or registered

    def observe(self, batch: BatchSeen) -> None:
        """Static: nothing to learn."""

    def decide(self, view: View) -> Decision | None:
        return Decision(self.knobs, {"static": True}) if view.knobs != self.knobs else None


class Greedy:
    name = "greedy"
    observes = False
    shed = False
    deadline_dispatch = False

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        self.batch_size = settings.batch_size[1]

    def observe(self, batch: BatchSeen) -> None:
        """Greedy: nothing to learn."""

    def decide(self, view: View) -> Decision | None:
        knobs = Knobs(self.batch_size, 0.0, view.knobs.workers)
        return Decision(knobs, {"greedy": True}) if view.knobs != knobs else None


class Aimd:
    name = "aimd"
    observes = True
    shed = False
    deadline_dispatch = False

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        params = settings.params.get("aimd", {})
        self.step = float(params.get("step", 1.0))
        self.backoff = float(params.get("backoff", 0.9))
        self.low, self.high = settings.batch_size
        self.target_ms = settings.target_ms
        self.cap = float(max(self.low, min(self.high, registered.batch_size)))

    def observe(self, batch: BatchSeen) -> None:
        if batch.actual_ms > self.target_ms:
            self.cap = max(float(self.low), self.cap * self.backoff)
        elif batch.size >= math.floor(self.cap):  # Clipper grows the cap when a full batch met the objective
            self.cap = min(float(self.high), self.cap + self.step)

    def decide(self, view: View) -> Decision | None:
        knobs = Knobs(max(self.low, math.floor(self.cap)), 0.0, view.knobs.workers)
        return Decision(knobs, {"cap": round(self.cap, 2)}) if view.knobs != knobs else None


class LeastSquares:
    name = "lsq"
    observes = False
    deadline_dispatch = True  # BentoML holds a batch while its oldest request can still make max_latency

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        self.shed = True
        self.knobs = Knobs(settings.batch_size[1], float(settings.max_batch_delay_ms[1]), registered.workers)

    def observe(self, batch: BatchSeen) -> None:
        """The fit is the controller's."""

    def decide(self, view: View) -> Decision | None:
        knobs = Knobs(self.knobs.batch_size, self.knobs.max_batch_delay_ms, view.knobs.workers)
        return Decision(knobs, {"lsq": True}) if view.knobs != knobs else None


class QueueScaling:
    name = "queue"
    observes = False
    shed = False
    deadline_dispatch = False

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        params = settings.params.get("queue", {})
        self.target = float(params.get("target_ongoing", 2.0))
        self.up_s = float(params.get("upscale_s", 30.0))
        self.down_s = float(params.get("downscale_s", 600.0))
        self.registered = registered
        self._asking: tuple[int, float] | None = None  # (workers asked for, since)

    def observe(self, batch: BatchSeen) -> None:
        """Ray's autoscaler looks at ongoing requests only."""

    def decide(self, view: View) -> Decision | None:
        low, high = view.workers_bounds
        want = max(low, min(high, math.ceil(view.ongoing / self.target)))
        now = view.knobs.workers
        if want == now:
            self._asking = None
            return None
        if self._asking is None or (self._asking[0] > now) != (want > now):
            self._asking = (want, view.now)
        wait = self.up_s if want > now else self.down_s
        if view.now - self._asking[1] < wait:
            return None
        self._asking = None
        knobs = Knobs(self.registered.batch_size, self.registered.max_batch_delay_ms, want)
        return Decision(knobs, {"ongoing": view.ongoing, "target_ongoing": self.target})


class Oracle:
    name = "oracle"
    observes = False
    shed = False
    deadline_dispatch = False

    def __init__(self, settings: ControlSettings, registered: Knobs) -> None:
        self.phases = settings.phases

    def observe(self, batch: BatchSeen) -> None:
        """The oracle knows the trace already."""

    def decide(self, view: View) -> Decision | None:
        phase = next((p for p in self.phases if view.elapsed_s < p.until_s), self.phases[-1])
        if phase.knobs == view.knobs:
            return None
        return Decision(phase.knobs, {"phase_until_s": phase.until_s})


__all__ = ["Aimd", "Greedy", "LeastSquares", "Oracle", "QueueScaling", "Static"]
