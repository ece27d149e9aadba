"""An app: several models served together by one server, tuned for what the app's users wait for.

app: animated_drawings            # the app's name (default: the study file's name)
models:                           # every model: its archive, input and space, as in a one-model study
  drawn_humanoid_detector:
    archive: model_store/drawn_humanoid_detector.mar
    input: drawings/
    form_field: data
    space: {workers: [1, 2], batch_size: [1, 2], threads: [1, 2]}
    sla: {p99_ms: 1500}           # optional: on this model's own stage
  drawn_humanoid_pose_estimator:
    archive: model_store/drawn_humanoid_pose_estimator.mar
    space: {workers: [1, 2], batch_size: [1, 4]}
pipeline:                         # how the app calls them (bench/pipeline.py) ...
  - drawn_humanoid_detector
  - {model: drawn_humanoid_pose_estimator, request: crop_top_box, form_field: data}
# mix: {detector: 1, pose: 3}     # ... or each model's share of independent requests (load mode capacity)
sla: {p99_ms: 3000}               # end to end (a pipeline), or every model's (a mix)
load: {duration: 15s, warmup: 3s} # closed loop: enough clients to fill every model's batches; or capacity
strategy: adaptive                # budget, server, backend: as in a one-model study

Each trial sets every model (one point of the product of their spaces); the adaptive search walks it without
enumerating it (``space.py``: the share of the cores between models is a move of its own). Everything is checked
here, before any trial: every error names the key and the value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError
from servetune.bench.hooks import HOOKS, load_hook
from servetune.bench.spec import parse_stages
from servetune.tune import _values as v
from servetune.tune.forms import servetune as single
from servetune.tune.study import AppConfig, Family, ModelSpec, Point, Study

TOP_KEYS = (
    "app", "models", "pipeline", "mix", "sla", "objective", "load", "strategy", "budget", "server", "references",
    "contention",
)  # fmt: skip
MODEL_KEYS = ("archive", "input", "content_type", "form_field", "sla", "model_config", "space")


def looks_like(raw: Mapping[str, Any]) -> bool:
    """An app names its models under ``models`` (TorchServe's form has model names at the top level)."""
    return isinstance(raw.get("models"), Mapping) and any(k in raw for k in ("pipeline", "mix", "sla", "load", "app"))


def parse(
    raw: Mapping[str, Any],
    source: Path,
    devices: set[str],
    *,
    extra_keys: tuple[str, ...] = (),
) -> Study:
    v.check_keys("", raw, (*TOP_KEYS, *extra_keys))
    base = source.parent
    name = v.text("app", raw["app"]) if "app" in raw else source.stem
    load = single.parse_load(raw.get("load"), base)
    if load.mode == "trace":
        raise ConfigError("load.trace: an app study is loaded by its pipeline or mix; a trace is for one model")
    models = v.mapping("models", raw["models"])
    if len(models) < 2:
        raise v.fail("models", list(models), "two or more models (a study of one model names it at the top level)")
    families: list[Family] = []
    specs: list[ModelSpec] = []
    notes: list[str] = []
    for model, entry in models.items():
        where = f"models.{model}"
        entry = v.mapping(where, entry)
        v.check_keys(where, entry, MODEL_KEYS)
        _, own, baseline, own_notes = single.parse_model(where, entry, base, devices, load, name=model)
        families += own
        notes += [f"{model}: {note}" for note in own_notes]
        specs.append(ModelSpec(model, baseline, single.parse_sla(entry.get("sla"), f"{where}.sla")))
    objective = single.parse_objective(raw.get("objective", "throughput"))
    if objective.kind != "throughput":
        raise v.fail("objective", raw["objective"], "throughput (an app's cost per request is not modelled yet)")
    sla, sla_scale = single.parse_sla_scaled(raw.get("sla"))
    study = Study(
        model=name,
        families=tuple(families),
        baseline_family=specs[0].baseline_family,
        sla=sla,
        sla_scale=sla_scale,
        contention=single.parse_contention(raw.get("contention")),
        objective=objective,
        strategy=single.parse_strategy(raw.get("strategy", "adaptive")),
        budget=single.parse_budget(raw.get("budget")),
        server=single.parse_server(raw.get("server")),
        form="servetune",
        source=source.resolve(),
        notes=tuple(notes),
        models=tuple(specs),
    )
    study = _traffic(study, raw, base)
    return dataclasses.replace(study, references=_references(study, raw.get("references")))


def _references(study: Study, value: Any) -> tuple[tuple[str, Point], ...]:
    """Configs of the whole app measured beside the search: ``{label: {MODEL: {workers: 2, ...}, ...}}``; a model
    left out runs its default config."""
    out = []
    for label, spec in v.mapping("references", value or {}).items():
        where = f"references.{label}"
        parts = v.mapping(where, spec)
        for model in parts:
            if model not in study.model_names:
                raise v.fail(
                    f"{where}.{model}", parts[model], f"a config of one of the models ({', '.join(study.model_names)})"
                )
        configs = []
        for model in study.model_names:
            own = (*study.families_of(model), study.model_spec(model).baseline_family)
            default = study.model_spec(model).baseline_family
            configs.append(single.parse_reference(f"{where}.{model}", parts.get(model, {}), own, default))
        out.append((label, AppConfig(tuple(configs))))
    return tuple(out)


def _traffic(study: Study, raw: Mapping[str, Any], base: Path) -> Study:
    """The app's calls: a ``pipeline`` (its hooks loaded now, so a missing one fails before any trial) or a
    ``mix`` (each model's share of independent requests; capacity load only)."""
    names = study.model_names
    if ("pipeline" in raw) == ("mix" in raw):
        raise ConfigError("pipeline, mix: give one: how the app calls its models (a pipeline) or each model's share")
    if "mix" in raw:
        mix = v.mapping("mix", raw["mix"])
        for model in mix:
            if model not in names:
                raise v.fail(f"mix.{model}", mix[model], f"a share of one of the models ({', '.join(names)})")
        missing = [m for m in names if m not in mix]
        if missing:
            raise ConfigError(f"mix: no share for {', '.join(missing)}; expected one for every model")
        if study.families[0].load.mode != "capacity":
            raise ConfigError("mix: needs load mode capacity (each model's stream at its share of the app's rate)")
        shares = tuple((model, v.number(f"mix.{model}", mix[model])) for model in names)
        return dataclasses.replace(study, mix=shares)
    stages = parse_stages("pipeline", raw["pipeline"])
    for i, stage in enumerate(stages):
        if stage.model not in names:
            raise v.fail(f"pipeline[{i}].model", stage.model, f"one of the models ({', '.join(names)})")
        if i and stage.request not in HOOKS:
            load_hook(f"pipeline[{i}].request", stage.request, base)
        elif i == 0 and stage.request != "input":
            raise v.fail("pipeline[0].request", stage.request, "input (the first stage sends its model's input)")
    called = [stage.model for stage in stages]
    for i, model in enumerate(called):
        if called.index(model) != i:
            raise v.fail(f"pipeline[{i}].model", model, "each model once (a model called twice is not supported)")
    for model in names:
        if model not in called:
            raise ConfigError(f"models.{model}: not called by the pipeline; expected every model in it")
    first = study.families_of(stages[0].model)[0]
    if first.input is None:
        raise ConfigError(f"models.{stages[0].model}.input: missing; the pipeline's first stage sends it")
    return dataclasses.replace(study, pipeline=stages)
