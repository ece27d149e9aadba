"""What one load run is asked to do: the target, the load shape, the input. Validated once, here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from servetune._exceptions import ConfigError
from servetune.bench.host import CONTENDED_CORES
from servetune.bench.schedule import Schedule
from servetune.bench.slo import Slo

Arrival = Literal["constant", "poisson", "gamma"]
Mode = Literal["closed", "open"]

_WARMUP = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(s|sec|seconds?|r|req|requests?)?\s*$", re.IGNORECASE)
_MODEL_PATH = re.compile(r"^/(?:predictions|explanations|v1/models|v2/models)/([^/:]+)")


@dataclass(frozen=True)
class StageSpec:
    """One call of a pipeline: POST to ``url`` (default ``{base}/predictions/{model}``) a request made by ``request``
    from the previous stage's answer (a hook of ``servetune.bench.hooks`` by name, or ``FILE.py:FUNCTION``, relative
    to ``BenchSpec.hook_dir``); the first stage sends the run's input (``request: input``). ``content_type`` and
    ``form_field`` say how a hook's bytes are sent (raw, or as one multipart field)."""

    model: str
    request: str = "answer"
    content_type: str | None = None
    form_field: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class BenchSpec:
    """One load run.

    Closed loop (``rate is None``): ``concurrency`` clients (default 1) each send a request as soon as their previous
    one is answered, for ``requests`` requests and/or ``duration`` seconds, whichever ends first.
    Open loop (``rate`` set): requests leave on a fixed schedule (``arrival`` constant, Poisson, or Gamma with
    coefficient of variation ``cv``, seeded by ``seed``) for ``duration``
    seconds and/or ``requests`` requests; latency is timed from each request's intended send time.
    Open loop on a ``schedule`` (a trace, a synthetic shape: ``schedule.py``): its sends, cut to ``duration`` and/or
    ``requests`` measured ones when given.
    ``slo``: goodput, attainment and windows of ``window_s`` seconds are reported against it (``slo.py``).
    ``server_pids``: the server's processes (with their children), so that their CPU is not counted as
    interference (default: the processes listening on the URL's port, when it is on this machine);
    ``contended_cores``: the other processes' CPU (cores) from which a run is marked contended (``host.py``).
    Warm-up (``warmup_requests`` or ``warmup_seconds``) runs first and is excluded from every figure.
    A pipeline (``stages``): each request of the load is the app's whole call graph, one stage after the other;
    ``url`` is then the server's inference address, the result's figures are end to end (from the intended start
    to the last answer) and ``BenchResult.stages`` holds each stage's.
    """

    url: str
    input: Path | None = None
    content_type: str | None = None
    form_field: str | None = None
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()
    concurrency: int | None = None
    rate: float | None = None
    arrival: Arrival = "constant"
    cv: float = 1.0  # gamma arrivals: the coefficient of variation of the gaps (1: Poisson; 2: burstier)
    requests: int | None = None
    duration: float | None = None
    warmup_requests: int = 0
    warmup_seconds: float = 0.0
    timeout: float = 60.0
    engine: str = "async"
    metrics_url: str | None = None
    management_url: str | None = None
    management_token: str | None = field(default=None, repr=False)  # Bearer key for management_url, if it wants one
    max_connections: int = 1024
    seed: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    stages: tuple[StageSpec, ...] = ()
    hook_dir: Path | None = None
    schedule: Schedule | None = None
    slo: Slo | None = None
    window_s: float = 10.0
    server_pids: tuple[int, ...] = ()
    contended_cores: float = CONTENDED_CORES

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"url={self.url!r}: expected http://HOST:PORT/PATH")
        for key in ("metrics_url", "management_url"):
            value = getattr(self, key)
            if value is not None and urlsplit(value).scheme not in ("http", "https"):
                raise ConfigError(f"{key}={value!r}: expected http://HOST:PORT")
        if self.concurrency is not None and self.rate is not None:
            raise ConfigError(f"concurrency={self.concurrency} and rate={self.rate}: give one (closed or open loop)")
        if self.schedule is not None and (self.rate is not None or self.concurrency is not None):
            given = "rate" if self.rate is not None else "concurrency"
            raise ConfigError(f"schedule and {given} are both set: a schedule (a trace) says when each request leaves")
        if self.schedule is not None and not len(self.schedule):
            raise ConfigError(f"schedule {self.schedule.name!r}: it sends no request")
        _positive("window_s", self.window_s)
        _positive("contended_cores", self.contended_cores)
        _positive("concurrency", self.concurrency, integer=True)
        _positive("rate", self.rate)
        _positive("requests", self.requests, integer=True)
        _positive("duration", self.duration)
        _positive("timeout", self.timeout)
        _positive("max_connections", self.max_connections, integer=True)
        if self.requests is None and self.duration is None and self.schedule is None:
            raise ConfigError("requests=None and duration=None: give a number of requests or a duration in seconds")
        if self.arrival not in ("constant", "poisson", "gamma"):
            raise ConfigError(f"arrival={self.arrival!r}: expected 'constant', 'poisson' or 'gamma'")
        _positive("cv", self.cv)
        if self.warmup_requests < 0 or isinstance(self.warmup_requests, bool):
            raise ConfigError(f"warmup_requests={self.warmup_requests!r}: expected an integer >= 0")
        if not (self.warmup_seconds >= 0 and math.isfinite(self.warmup_seconds)):
            raise ConfigError(f"warmup_seconds={self.warmup_seconds!r}: expected seconds >= 0")
        if self.warmup_requests and self.warmup_seconds:
            raise ConfigError("warmup_requests and warmup_seconds are both set: give one")
        if self.method.upper() not in ("POST", "PUT", "GET"):
            raise ConfigError(f"method={self.method!r}: expected POST, PUT or GET")
        if self.stages:
            self._check_pipeline()

    def _check_pipeline(self) -> None:
        if self.engine != "async":
            raise ConfigError(f"engine={self.engine!r}: a pipeline runs on the built-in engine (async)")
        names = [stage.model for stage in self.stages]
        for i, stage in enumerate(self.stages):
            if not stage.model or "/" in stage.model:
                raise ConfigError(f"pipeline[{i}].model={stage.model!r}: expected a model name")
            if names.count(stage.model) > 1:
                raise ConfigError(f"pipeline[{i}].model={stage.model!r}: each model may appear once in a pipeline")
            if (i == 0) != (stage.request == "input"):
                expected = "input (the first stage sends the input)" if i == 0 else "a hook (only the first is input)"
                raise ConfigError(f"pipeline[{i}].request={stage.request!r}: expected {expected}")
            if stage.url is not None and urlsplit(stage.url).scheme not in ("http", "https"):
                raise ConfigError(f"pipeline[{i}].url={stage.url!r}: expected http://HOST:PORT/PATH")

    @property
    def mode(self) -> Mode:
        return "closed" if self.rate is None and self.schedule is None else "open"

    def open_schedule(self) -> Schedule:
        """Every send of an open-loop run, warm-up included: the given schedule, or one of ``rate`` (cut to the
        measured part by the engine)."""
        if self.schedule is not None:
            return self.schedule
        assert self.rate is not None
        rate = self.rate
        # Long enough for the warm-up however Poisson spaces it; the engine stops at the measured part's end.
        warmup = max(
            self.warmup_seconds, 1.2 * self.warmup_requests / rate + 20.0 / rate if self.warmup_requests else 0
        )
        seconds = None if self.duration is None else warmup + self.duration + 2.0 / rate
        requests = None if self.requests is None else self.warmup_requests + self.requests + 1
        if seconds is None and requests is None:
            seconds = warmup + 1.0
        return Schedule.steady(rate, self.arrival, seconds=seconds, requests=requests, cv=self.cv, seed=self.seed)

    @property
    def clients(self) -> int:
        """Closed-loop concurrency (1 when not given)."""
        return self.concurrency or 1

    @property
    def model(self) -> str | None:
        """The model name when the URL is a TorchServe prediction URL (``/predictions/{model}[/{version}]``)."""
        match = _MODEL_PATH.match(urlsplit(self.url).path)
        return match.group(1) if match else None

    def stage_url(self, stage: StageSpec) -> str:
        return stage.url or f"{self.url.rstrip('/')}/predictions/{stage.model}"


STAGE_KEYS = ("model", "request", "content_type", "form_field", "url")


def parse_stages(where: str, value: Any) -> tuple[StageSpec, ...]:
    """A pipeline from YAML: a list whose items are a model name or ``{model, request, content_type, form_field,
    url}``; the first stage's request is ``input``, a later one's defaults to ``answer``. Errors name the key."""
    if not isinstance(value, list) or len(value) < 2:
        raise ConfigError(f"{where}={value!r}: expected a list of two or more stages (model names or mappings)")
    stages = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        entry = {"model": item} if isinstance(item, str) else item
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}={item!r}: expected a model name or a mapping with a 'model' key")
        for key in entry:
            if key not in STAGE_KEYS:
                raise ConfigError(f"{at}.{key}: unknown key; expected one of {', '.join(STAGE_KEYS)}")
        for key in entry:
            if not isinstance(entry[key], str) or not entry[key].strip():
                raise ConfigError(f"{at}.{key}={entry[key]!r}: expected a non-empty string")
        if "model" not in entry:
            raise ConfigError(f"{at}.model: missing; expected the name of the model this stage calls")
        request = entry.get("request", "input" if i == 0 else "answer")
        stages.append(StageSpec(entry["model"].strip(), request.strip(), entry.get("content_type"),
                                entry.get("form_field"), entry.get("url")))  # fmt: skip
    return tuple(stages)


def parse_warmup(value: str) -> tuple[int, float]:
    """``"100"`` -> 100 requests; ``"5s"`` -> 5 seconds. Returns ``(warmup_requests, warmup_seconds)``."""
    match = _WARMUP.match(value)
    if match is None:
        raise ConfigError(f"warmup={value!r}: expected a number of requests (100) or seconds (5s)")
    number, unit = match.group(1), (match.group(2) or "r").lower()
    if unit.startswith("s"):
        return 0, float(number)
    if "." in number:
        raise ConfigError(f"warmup={value!r}: a number of requests must be a whole number")
    return int(number), 0.0


def _positive(key: str, value: float | None, integer: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or (integer and not isinstance(value, int)):
        raise ConfigError(f"{key}={value!r}: expected a whole number > 0")
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key}={value!r}: expected a number > 0")
