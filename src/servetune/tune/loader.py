"""Read a study file into a validated :class:`~servetune.tune.study.Study`, and apply command-line overrides.

Three YAML forms, recognised by their keys: servetune's own for one model (``forms/servetune.py``) or for an app of
several (``forms/app.py``), and TorchServe's auto-benchmark model config (``forms/torchserve.py``). The keys that
choose and place the backend (``backend``, and each target's address key such as ``ray_address``) and the space
keys a target owns (such as ``space.ray_ongoing_batches``) are read here and handed to that target
(``targets/``), so the forms know no backend. Everything is checked before any trial runs; every error names the
key, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from servetune._exceptions import ConfigError
from servetune.tune import online, targets
from servetune.tune.forms import app as app_form
from servetune.tune.forms import servetune as servetune_form
from servetune.tune.forms import torchserve as torchserve_form
from servetune.tune.study import Family, Study


def host_devices() -> set[str]:
    """The devices this host can serve on (CUDA counted the way the server counts GPUs)."""
    from servetune.hardware import detect_gpus

    return {"cpu", "cuda"} if detect_gpus() > 0 else {"cpu"}


def load_study(path: Path, *, devices: set[str] | None = None) -> Study:
    """Read and validate a study file in either form; raises ConfigError naming the key and value at fault."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"study file {str(path)!r}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"study file {str(path)!r}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"study file {str(path)!r}: expected a mapping at the top level")
    available = host_devices() if devices is None else devices
    if app_form.looks_like(raw):
        placement = {key: raw[key] for key in targets.placement_keys() if key in raw}
        rest = {k: v for k, v in raw.items() if k not in placement}
        study = app_form.parse(rest, path, available, extra_keys=targets.placement_keys())
        study = dataclasses.replace(study, **_placement(placement))
    elif servetune_form.looks_like(raw):
        placement = {key: raw[key] for key in targets.placement_keys() if key in raw}
        rest = {k: v for k, v in raw.items() if k not in placement}
        study = servetune_form.parse(
            rest, path, available, extra_keys=targets.placement_keys(), extra_space_keys=targets.space_keys()
        )
        study = dataclasses.replace(study, **_placement(placement), options=_options(rest))
    else:
        study = torchserve_form.parse(raw, path, available)
    validate(study)
    return study


def _placement(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``backend`` (default native) and the address key of a target, type-checked (values in ``validate``)."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(value, str) or not value.strip():
            expected = " or ".join(targets.TARGETS) if key == "backend" else targets.kind_of_address(key).address_hint
            raise ConfigError(f"{key}={value!r}: expected {expected}")
        out["backend" if key == "backend" else "backend_address"] = value.strip()
    return out


def _options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every target's own space keys, read by that target (whichever backend the study runs on)."""
    space = raw.get("space") or {}
    model_config = raw.get("model_config") or {}
    options: dict[str, Any] = {}
    for kind in targets.kinds():
        options.update(kind.read(space, model_config))
    return options


def override(
    study: Study,
    *,
    sla_p99_ms: float | str | None = None,
    budget_s: float | None = None,
    strategy: str | None = None,
    backend: str | None = None,
    address: str | None = None,
    protocol: str | None = None,
) -> Study:
    """The study with command-line overrides applied (CLI > file), validated again. ``address`` is the backend's
    address (``--ray-address``); another backend than the file's drops the file's address. ``sla_p99_ms`` is
    milliseconds, or a multiple of this machine's single-request latency (``"3x"``)."""
    if backend is not None:
        study = dataclasses.replace(
            study, backend=backend, backend_address=study.backend_address if backend == study.backend else None
        )
    if address is not None:
        study = dataclasses.replace(study, backend_address=address)
    if sla_p99_ms is not None:
        from servetune.tune.forms.servetune import multiple

        scale = tuple(item for item in study.sla_scale if item[0] != "p99_ms")
        if isinstance(sla_p99_ms, str) and sla_p99_ms.strip().lower().endswith("x"):
            scale += (("p99_ms", multiple("--sla-p99", sla_p99_ms)),)
            study = dataclasses.replace(study, sla=dataclasses.replace(study.sla, p99_ms=None), sla_scale=scale)
        else:
            try:
                limit = float(sla_p99_ms)
            except ValueError:
                limit = -1.0
            if not limit > 0:
                raise ConfigError(f"--sla-p99={sla_p99_ms!r}: expected milliseconds > 0 or a multiple such as 3x")
            study = dataclasses.replace(study, sla=dataclasses.replace(study.sla, p99_ms=limit), sla_scale=scale)
    if protocol is not None:
        study = with_protocol(study, protocol)
    if budget_s is not None:
        study = dataclasses.replace(study, budget=dataclasses.replace(study.budget, seconds=budget_s))
    if strategy is not None:
        from servetune.tune.strategies import STRATEGIES

        if strategy not in STRATEGIES:
            raise ConfigError(f"strategy={strategy!r}: expected one of {', '.join(STRATEGIES)}")
        study = dataclasses.replace(study, strategy=dataclasses.replace(study.strategy, name=strategy))
    validate(study)
    return study


def with_protocol(study: Study, protocol: str) -> Study:
    """Every family's load over ``protocol`` (``--protocol``)."""
    from servetune.tune.forms.servetune import parse_protocol

    def moved(family: Family) -> Family:
        load = dataclasses.replace(family.load, protocol=parse_protocol("--protocol", protocol, family.load.engine))
        return dataclasses.replace(family, load=load)

    models = tuple(dataclasses.replace(m, baseline_family=moved(m.baseline_family)) for m in study.models)
    return dataclasses.replace(
        study, families=tuple(moved(f) for f in study.families), baseline_family=moved(study.baseline_family),
        models=models,
    )  # fmt: skip


def validate(study: Study) -> None:
    """Checks that span sections (each section checks itself as it is read), then the backend's own."""
    targets.check(study)
    if study.pipeline and study.families[0].load.protocol != "torchserve":
        raise ConfigError(
            f"load.protocol={study.families[0].load.protocol!r}: a pipeline calls its models through TorchServe's "
            "API (/predictions); expected torchserve"
        )
    no_sla = study.sla.empty and not study.sla_scale and all(m.sla.empty for m in study.models)
    for mode in ("capacity", "trace"):
        if any(f.load.mode == mode for f in study.families) and no_sla:
            raise ConfigError(f"load={mode} needs a latency SLA (sla.p99_ms, p95_ms or mean_ms, or --sla-p99)")
    if study.strategy.controller and (why := online.unsupported(study)) is not None:
        raise ConfigError(f"strategy.controller=true: {why}")
    if study.objective.kind == "cost":
        priced = dict(study.objective.prices)
        for family in study.families:
            if family.device not in priced:
                raise ConfigError(f"objective.cost: no price for device {family.device!r} (space.devices lists it)")
