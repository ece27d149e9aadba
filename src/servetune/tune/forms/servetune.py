"""servetune's own study format.

model: resnet18                 # the name to serve under (default: the archive's file name)
archive: model_store/resnet18.mar
input: kitten.jpg               # a file, or a folder of files sent in turn
sla: {p99_ms: 100}              # and/or p95_ms, mean_ms; max_error_rate (default 0.001); "3x": 3 x this machine's
                                # single-request latency, measured first
objective: throughput           # or {cost: {cpu: 0.40, cuda: 3.00}}  (price per device-hour)
space:
  optimizations: [eager, bf16]
  devices: [cpu, cuda]
  workers: [1, 2, 4]
  batch_size: [1, 2, 4, 8]
  batch_delay_ms: [10, 50]
  threads: [auto, 1, 2]         # intra-op threads per worker (numThreads); auto: an even share of the cores
  inter_op_threads: [1]         # torch's inter-op pool per worker; auto: torch's default
  pinning: [false, true]        # each worker on its own cores (cpuPinning)
  ray_ongoing_batches: [1, 2]   # a target's own key (here Ray's): read by that target, see targets/
load: capacity                  # or {concurrency: 16}, or {trace: FILE, ...}; default: clients = batch size x workers
strategy: adaptive              # or grid; {name: adaptive, remeasure: 3, finalists: 2, rounds: 3, controller: false}
                                # controller: true (a trace load): the winner against the online controller on it
contention: {max_other_cores: 0.15, retries: 2}
budget: 20m                     # or {time: 20m, trials: 40}

``backend`` and a target's address key (``ray_address``) are read by the loader, not here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servetune._exceptions import ArchiveError, ConfigError
from servetune.tune import _values as v
from servetune.tune.study import (
    DEVICES,
    Budget,
    Config,
    Contention,
    Family,
    Load,
    Objective,
    Sla,
    StrategySpec,
    Study,
)

TOP_KEYS = (
    "model", "archive", "input", "content_type", "form_field", "sla", "objective", "space", "load", "strategy",
    "budget", "server", "model_config", "references", "contention",
)  # fmt: skip
SPACE_KEYS = (
    "optimizations", "devices", "workers", "batch_size", "batch_delay_ms", "threads", "inter_op_threads", "pinning",
)  # fmt: skip
LOAD_KEYS = (
    "mode", "concurrency", "factor", "requests", "duration", "warmup", "arrival", "steps", "engine", "timeout",
    "protocol", "early_stop", "max_duration", "trace", "trace_format", "trace_options", "time_scale", "rate_scale",
    "capacity_fraction",
)  # fmt: skip
TRACE_KEYS = ("trace", "trace_format", "trace_options", "time_scale", "rate_scale", "capacity_fraction")
# config.properties keys the tuner sets itself for the embedded server
RESERVED_SERVER_KEYS = (
    "inference_address", "management_address", "metrics_address", "model_store", "load_models", "models",
    "enable_model_api", "key_file", "disable_token_authorization",
)  # fmt: skip
_MARKERS = ("archive", "space", "sla", "objective", "load", "strategy", "budget")


def looks_like(raw: Mapping[str, Any]) -> bool:
    """servetune's form has these top-level keys; TorchServe's has only model names."""
    return any(key in raw for key in _MARKERS)


def parse(
    raw: Mapping[str, Any],
    source: Path,
    devices: set[str],
    *,
    extra_keys: tuple[str, ...] = (),
    extra_space_keys: tuple[str, ...] = (),
) -> Study:
    """``extra_keys`` / ``extra_space_keys``: keys read elsewhere (by the loader and the targets), accepted here."""
    v.check_keys("", raw, (*TOP_KEYS, *extra_keys))
    load = parse_load(raw.get("load"), source.parent)
    model, families, baseline, notes = parse_model("", raw, source.parent, devices, load, extra_space_keys)
    sla, sla_scale = parse_sla_scaled(raw.get("sla"))
    references = v.mapping("references", raw.get("references") or {})
    return Study(
        model=model,
        families=families,
        baseline_family=baseline,
        sla=sla,
        sla_scale=sla_scale,
        contention=parse_contention(raw.get("contention")),
        objective=parse_objective(raw.get("objective", "throughput")),
        strategy=parse_strategy(raw.get("strategy", "adaptive")),
        budget=parse_budget(raw.get("budget")),
        server=parse_server(raw.get("server")),
        form="servetune",
        source=source.resolve(),
        notes=tuple(notes),
        references=tuple(
            (label, parse_reference(f"references.{label}", spec, (*families, baseline), baseline))
            for label, spec in references.items()
        ),
    )


REFERENCE_KEYS = (
    "optimization", "device", "workers", "batch_size", "batch_delay_ms", "threads", "inter_op_threads", "pinning",
)  # fmt: skip


def parse_reference(where: str, value: Any, families: tuple[Family, ...], default: Family) -> Config:
    """A config to measure beside the search: its knobs (defaults: the default config's), in one of the study's
    families (values outside the searched ones are allowed: it is a reference, not a point of the space)."""
    spec = v.mapping(where, value)
    v.check_keys(where, spec, REFERENCE_KEYS)
    optimization = v.text(f"{where}.optimization", spec.get("optimization", default.optimization))
    device = v.text(f"{where}.device", spec.get("device", default.device))
    family = next((f for f in families if (f.optimization, f.device) == (optimization, device)), None)
    if family is None:
        known = ", ".join(dict.fromkeys(f"{f.optimization}/{f.device}" for f in families))
        raise ConfigError(f"{where}: {optimization}/{device} is not one of the study's families ({known})")
    delays = default.batch_delays_ms
    return Config(
        family.label,
        v.integer(f"{where}.workers", spec.get("workers", 1)),
        v.integer(f"{where}.batch_size", spec.get("batch_size", 1)),
        v.integer(f"{where}.batch_delay_ms", spec.get("batch_delay_ms", delays[len(delays) // 2]), minimum=0),
        v.integer(f"{where}.threads", spec.get("threads", 0), minimum=0),
        v.integer(f"{where}.inter_op_threads", spec.get("inter_op_threads", 0), minimum=0),
        v.boolean(f"{where}.pinning", spec.get("pinning", False)),
    )


def parse_model(
    where: str,
    raw: Mapping[str, Any],
    base: Path,
    devices: set[str],
    load: Load,
    extra_space_keys: tuple[str, ...] = (),
    *,
    name: str | None = None,
) -> tuple[str, tuple[Family, ...], Family, list[str]]:
    """One model's archive, input and space (``where``: its key path, empty at the top level; ``name``: its name
    in an app, whose families are then labelled ``NAME/OPTIMIZATION/DEVICE``). Returns the name, the families,
    the default config's family and notes."""

    def at(key: str) -> str:
        return f"{where}.{key}" if where else key

    if "archive" not in raw:
        raise ConfigError(
            f"{at('archive')}: missing; expected the path of the model archive (.mar, .tar.gz or a folder)"
        )
    archive = v.path(at("archive"), raw["archive"], base)
    model = name or (v.text("model", raw["model"]) if "model" in raw else archive.name.split(".")[0])
    from servetune.archive import validate_model_name

    try:
        validate_model_name(model)
    except ArchiveError as exc:
        raise ConfigError(f"{at('model') if name is None else where}={model!r}: {exc}") from None
    input_path = v.path(at("input"), raw["input"], base) if raw.get("input") is not None else None
    content_type = v.text(at("content_type"), raw["content_type"]) if "content_type" in raw else None
    form_field = v.text(at("form_field"), raw["form_field"]) if "form_field" in raw else None
    model_config = dict(v.mapping(at("model_config"), raw["model_config"])) if "model_config" in raw else {}
    space = v.mapping(at("space"), raw.get("space") or {})
    v.check_keys(at("space"), space, (*SPACE_KEYS, *extra_space_keys))
    optimizations = _optimizations(space.get("optimizations", ["eager"]), at("space.optimizations"))
    wanted = v.texts(at("space.devices"), space.get("devices", ["cpu"]))
    for i, device in enumerate(wanted):
        if device not in DEVICES:
            raise v.fail(f"{at('space.devices')}[{i}]", device, f"one of {', '.join(DEVICES)}")
    notes = [f"device {d!r} skipped: this host has no {d.upper()}" for d in wanted if d not in devices]
    usable = [d for d in wanted if d in devices]
    if not usable:
        raise ConfigError(f"{at('space.devices')}={list(wanted)!r}: none is available on this host")
    knobs = {
        "workers": v.integers(at("space.workers"), space.get("workers", [1])),
        "batch_sizes": v.integers(at("space.batch_size"), space.get("batch_size", [1])),
        "batch_delays_ms": v.integers(at("space.batch_delay_ms"), space.get("batch_delay_ms", [100]), minimum=0),
        **_thread_knobs(at, space, model_config),
    }
    prefix = f"{model}/" if name else ""
    families = tuple(
        Family(
            label=f"{prefix}{opt}/{device}",
            archive=archive,
            optimization=opt,
            device=device,
            load=load,
            input=input_path,
            content_type=content_type,
            form_field=form_field,
            model_config=model_config,
            model=name or "",
            **knobs,
        )
        for opt in optimizations
        for device in usable
    )
    eager = [f for f in families if f.optimization == "eager"]
    baseline = (
        eager[0]
        if eager
        else dataclasses.replace(families[0], label=f"{prefix}eager/{families[0].device}", optimization="eager")
    )
    return model, families, baseline, notes


# space key -> (Family field, model-config key the server reads)
THREAD_KNOBS = {
    "threads": ("threads", "numThreads"),
    "inter_op_threads": ("inter_op_threads", "interOpThreads"),
    "pinning": ("pinning", "cpuPinning"),
}


def _thread_knobs(at: Any, space: Mapping[str, Any], model_config: Mapping[str, Any]) -> dict[str, Any]:
    """``threads`` and ``inter_op_threads`` (whole numbers, or ``auto``/0 for the server's choice) and ``pinning``
    (true/false): searched like workers. A knob the model_config already sets is not searched again."""
    out: dict[str, Any] = {}
    for key, (name, config_key) in THREAD_KNOBS.items():
        if key not in space:
            continue
        if config_key in model_config:
            both = f"{at('space.' + key)} and {at('model_config.' + config_key)}"
            raise ConfigError(f"{both}: set one (a list to search, or one value)")
        value = space[key]
        items = value if isinstance(value, list) else [value]
        if key == "pinning":
            out[name] = tuple(sorted({v.boolean(f"{at('space.pinning')}[{i}]", x) for i, x in enumerate(items)}))
        else:
            counts = [0 if x == "auto" else x for x in items]
            out[name] = v.integers(at(f"space.{key}"), counts, minimum=0)
    return out


def _optimizations(value: Any, where: str = "space.optimizations") -> tuple[str, ...]:
    from servetune.optimize.registry import canonical_name

    names = v.texts(where, value)
    out: list[str] = []
    for i, name in enumerate(names):
        try:
            canonical = canonical_name(name)
        except ConfigError as exc:
            raise ConfigError(f"{where}[{i}]={name!r}: {exc}") from None
        if canonical not in out:
            out.append(canonical)
    return tuple(out)


def parse_sla(value: Any, where: str = "sla") -> Sla:
    sla, scale = parse_sla_scaled(value, where)
    if scale:
        raise ConfigError(f"{where}.{scale[0][0]}={scale[0][1]:g}x: a multiple of this machine's latency is for the "
                          "study's SLA only; give milliseconds here")  # fmt: skip
    return sla


def parse_sla_scaled(value: Any, where: str = "sla") -> tuple[Sla, tuple[tuple[str, float], ...]]:
    """The SLA, and the limits given as a multiple of this machine's single-request latency (``p99_ms: 3x``)."""
    if value is None:
        return Sla(), ()
    sla = v.mapping(where, value)
    v.check_keys(where, sla, ("p99_ms", "p95_ms", "mean_ms", "max_error_rate"))
    scale = tuple(
        (k, multiple(f"{where}.{k}", sla[k])) for k in ("p99_ms", "p95_ms", "mean_ms") if _is_multiple(sla.get(k))
    )
    limits = {
        k: v.number(f"{where}.{k}", sla[k])
        for k in ("p99_ms", "p95_ms", "mean_ms")
        if k in sla and k not in dict(scale)
    }
    error_rate = 0.001
    if "max_error_rate" in sla:
        error_rate = v.number(f"{where}.max_error_rate", sla["max_error_rate"], 0.0, strict=False)
        if error_rate >= 1:
            expected = "a fraction between 0 and 1 (0.001 = 0.1%)"
            raise v.fail(f"{where}.max_error_rate", sla["max_error_rate"], expected)
    return Sla(max_error_rate=error_rate, **limits), scale


def _is_multiple(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower().endswith("x")


def multiple(where: str, value: Any) -> float:
    """``"3x"`` -> 3.0: a limit as a multiple of this machine's single-request latency."""
    text = str(value).strip().lower().removesuffix("x").strip()
    try:
        number = float(text)
    except ValueError:
        raise v.fail(where, value, "milliseconds, or a multiple of the single-request latency such as 3x") from None
    if not number > 1:
        raise v.fail(where, value, "a multiple > 1 (3x: three times the single-request latency)")
    return number


def parse_contention(value: Any) -> Contention:
    if value is None:
        return Contention()
    spec = v.mapping("contention", value)
    v.check_keys("contention", spec, ("max_other_cores", "retries"))
    return Contention(
        max_other_cores=v.number("contention.max_other_cores", spec.get("max_other_cores", Contention.max_other_cores)),
        retries=v.integer("contention.retries", spec.get("retries", 2), 0),
    )


def parse_objective(value: Any) -> Objective:
    if value == "throughput":
        return Objective()
    if isinstance(value, Mapping) and list(value) == ["cost"]:
        prices = v.mapping("objective.cost", value["cost"])
        for device in prices:
            if device not in DEVICES:
                raise ConfigError(f"objective.cost.{device}: unknown device; expected one of {', '.join(DEVICES)}")
        return Objective("cost", tuple((d, v.number(f"objective.cost.{d}", p)) for d, p in sorted(prices.items())))
    raise v.fail("objective", value, "throughput, or {cost: {cpu: PRICE, cuda: PRICE}} (price per device-hour)")


def parse_load(value: Any, base: Path | None = None) -> Load:
    if value is None:
        return Load()
    if value in ("capacity", "concurrency"):
        return Load(mode=value)
    load = v.mapping("load", value)
    v.check_keys("load", load, LOAD_KEYS)
    mode = load.get("mode", "trace" if "trace" in load else "concurrency")
    if mode not in ("capacity", "concurrency", "trace"):
        raise v.fail("load.mode", mode, "capacity, concurrency or trace")
    changes: dict[str, Any] = {"mode": mode}
    if mode == "trace":
        changes.update(parse_trace(load, base or Path(".")))
    else:
        for key in TRACE_KEYS:
            if key in load:
                raise ConfigError(f"load.{key}: only with a trace (load.trace: FILE)")
    if "concurrency" in load and load["concurrency"] != "auto":
        if mode == "capacity":
            raise ConfigError("load.concurrency: only for mode concurrency (capacity mode sets the rate itself)")
        changes["concurrency"] = v.integer("load.concurrency", load["concurrency"])
    if "factor" in load:
        changes["factor"] = v.number("load.factor", load["factor"])
    if "requests" in load:
        changes["requests"] = v.integer("load.requests", load["requests"])
        changes["duration_s"] = None
    if "duration" in load:
        changes["duration_s"] = v.duration("load.duration", load["duration"])
    if "warmup" in load:
        changes["warmup_s"] = 0.0 if load["warmup"] == 0 else v.duration("load.warmup", load["warmup"])
    if "arrival" in load:
        if load["arrival"] not in ("constant", "poisson"):
            raise v.fail("load.arrival", load["arrival"], "constant or poisson")
        changes["arrival"] = load["arrival"]
    if "steps" in load:
        changes["steps"] = v.integer("load.steps", load["steps"])
    if "engine" in load:
        changes["engine"] = parse_engine("load.engine", load["engine"], mode)
    if "timeout" in load:
        changes["timeout_s"] = v.duration("load.timeout", load["timeout"])
    if "protocol" in load:
        changes["protocol"] = parse_protocol("load.protocol", load["protocol"], changes.get("engine", "async"))
    if "early_stop" in load:
        changes["early_stop"] = v.boolean("load.early_stop", load["early_stop"])
    if "max_duration" in load:
        changes["max_duration_s"] = v.duration("load.max_duration", load["max_duration"])
    return Load(**changes)


def parse_trace(load: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """A trace load's keys: the file (relative to the study), its format and importer options, and its scaling."""
    from servetune.bench.traces import TRACE_FORMATS

    if "trace" not in load:
        raise ConfigError("load.trace: missing; mode trace replays a trace file (docs/bench.md lists the formats)")
    out: dict[str, Any] = {"trace": v.path("load.trace", load["trace"], base), "early_stop": False}
    if "trace_format" in load:
        if load["trace_format"] not in TRACE_FORMATS:
            raise v.fail("load.trace_format", load["trace_format"], f"one of {', '.join(TRACE_FORMATS)}")
        out["trace_format"] = load["trace_format"]
    options = v.mapping("load.trace_options", load.get("trace_options") or {})
    out["trace_options"] = tuple((k, str(value)) for k, value in options.items())
    for key in ("time_scale", "rate_scale", "capacity_fraction"):
        if key in load:
            out[key] = v.number(f"load.{key}", load[key])
    for key in ("concurrency", "factor", "steps", "arrival", "requests"):
        if key in load:
            raise ConfigError(f"load.{key}: not with a trace (the trace says when each request leaves)")
    return out


def parse_protocol(where: str, value: Any, engine: str) -> str:
    from servetune.tune.protocols import DEFAULT, PROTOCOLS

    if value not in PROTOCOLS:
        raise v.fail(where, value, f"one of {', '.join(PROTOCOLS)}")
    if engine == "ab" and value != DEFAULT:
        raise ConfigError(f"{where}={value!r}: Apache Bench (load.engine ab) speaks TorchServe's API only")
    return str(value)


def parse_engine(where: str, value: Any, mode: str) -> str:
    from servetune.bench.engines import ENGINES

    if value not in ENGINES:
        raise v.fail(where, value, f"one of {', '.join(sorted(ENGINES))}")
    if value == "ab" and mode == "capacity":
        raise ConfigError(f"{where}='ab': Apache Bench is closed-loop only; capacity search needs the async engine")
    return str(value)


def parse_strategy(value: Any) -> StrategySpec:
    from servetune.tune.strategies import STRATEGIES

    spec = {"name": value} if isinstance(value, str) else dict(v.mapping("strategy", value))
    v.check_keys("strategy", spec, ("name", "remeasure", "finalists", "rounds", "controller"))
    name = spec.get("name", "adaptive")
    if name not in STRATEGIES:
        raise v.fail("strategy.name" if not isinstance(value, str) else "strategy", name, " or ".join(STRATEGIES))
    remeasure = v.integer("strategy.remeasure", spec["remeasure"], 0) if "remeasure" in spec else 3
    finalists = v.integer("strategy.finalists", spec.get("finalists", 2), 0)
    if finalists == 1:
        raise v.fail("strategy.finalists", 1, "0 (none) or 2 and more: finalists are compared with each other")
    rounds = v.integer("strategy.rounds", spec.get("rounds", 3), 2)
    controller = spec.get("controller", False)
    if not isinstance(controller, bool):
        raise v.fail("strategy.controller", controller, "true or false")
    return StrategySpec(name=name, remeasure=remeasure, finalists=finalists, rounds=rounds, controller=controller)


def parse_budget(value: Any) -> Budget:
    if value is None:
        return Budget()
    if not isinstance(value, Mapping):
        return Budget(seconds=v.duration("budget", value))
    v.check_keys("budget", value, ("time", "trials"))
    return Budget(
        seconds=v.duration("budget.time", value["time"]) if "time" in value else None,
        trials=v.integer("budget.trials", value["trials"]) if "trials" in value else None,
    )


def parse_server(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    props = {
        k: str(val).lower() if isinstance(val, bool) else str(val) for k, val in v.mapping("server", value).items()
    }
    from servetune.config.server import ServerConfig

    known = {f.name for f in dataclasses.fields(ServerConfig)}
    for key in props:
        if key in RESERVED_SERVER_KEYS:
            raise ConfigError(f"server.{key}: set by the tuner itself; remove it")
        if key not in known:
            raise ConfigError(f"server.{key}: not a config.properties key servetune uses")
    ServerConfig.from_properties(props)  # type-checks every value, naming the key
    return props
