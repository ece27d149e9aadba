"""The Ray backend's plan and Serve config: archives read, knobs mapped onto Ray Serve's. Needs no Ray cluster
(and no Ray, except for validating the config against Ray's own schema)."""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from models import sleep_archive
from ray_cluster import run_cli_without_ray
from servetune._exceptions import ApiError
from servetune.cli import cli
from servetune.config.server import ServerConfig
from servetune.ray import ModelPlan, ServedModel, plan_models, serve_config
from servetune.ray.controller import without_traceback
from servetune.ray.plan import deployment_name
from servetune.ray.serve_config import FrontendArgs, VersionArgs, max_ongoing_requests, served_model

HAS_RAY = importlib.util.find_spec("ray") is not None


def _config(store: Path, **properties: str) -> ServerConfig:
    return ServerConfig.from_properties({"model_store": str(store), **properties})


def _validate_with_ray(config: dict[str, object]) -> None:
    if HAS_RAY:
        with warnings.catch_warnings():  # Ray's schema module uses pydantic features deprecated in 2.x
            warnings.simplefilter("ignore", DeprecationWarning)
            from ray.serve.schema import ServeDeploySchema

        ServeDeploySchema.model_validate(config)


def test_model_config_knobs_become_ray_serve_knobs(tmp_path: Path) -> None:
    model_config = {
        "minWorkers": 2,
        "maxWorkers": 4,
        "batchSize": 8,
        "maxBatchDelay": 50,
        "deviceType": "gpu",
        "numThreads": 2,
        "responseTimeout": 30,
        "optimization": "bf16",
    }
    sleep_archive(tmp_path, model_config=model_config)
    [model] = plan_models(_config(tmp_path), ("sleep.mar",))
    plan = model.get(None)
    assert (plan.min_workers, plan.max_workers, plan.batch_size, plan.max_batch_delay_ms) == (2, 4, 8, 50)
    assert plan.plan.config.handler_config["optimization"] == "bf16"  # the variant is applied by the handler at load
    assert plan.plan.archive == str((tmp_path / "sleep.mar").resolve())

    config = serve_config([model], host="127.0.0.1", port=8123, proxy_location="HeadOnly")
    _validate_with_ray(config)
    frontend, app = config["applications"]
    assert (frontend["name"], frontend["route_prefix"]) == ("servetune", "/")
    assert (app["name"], app["route_prefix"]) == ("sleep_v1_0", "/predictions/sleep")
    assert app["args"]["version"]["config"]["batch_size"] == 8
    [deployment] = app["deployments"]
    assert deployment["name"] == "sleep_v1_0"
    assert deployment["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 4,
        "initial_replicas": 2,
        "target_ongoing_requests": 8,
    }
    assert "num_replicas" not in deployment
    served = {"name": "sleep", "default": "1.0", "versions": ["1.0"], "deployed": ["1.0"]}
    assert deployment["user_config"] == {"batch_size": 8, "max_batch_delay_ms": 50, "num_threads": 2, "model": served}
    assert deployment["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 1}
    assert deployment["max_ongoing_requests"] == max_ongoing_requests(8) >= 8
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8123}


def test_a_batch_change_in_place_touches_only_what_ray_applies_without_a_restart(tmp_path: Path) -> None:
    sleep_archive(tmp_path, model_config={"batchSize": 2, "maxBatchDelay": 50})
    [model] = plan_models(_config(tmp_path), ("sleep.mar",))
    plan = replace(model.get(None), batch_size=8, max_batch_delay_ms=5)
    assert (plan.batch_size, plan.max_batch_delay_ms, plan.plan.batch_size) == (8, 5, 2)
    before, after = serve_config([model]), serve_config([ModelPlan("sleep", {"1.0": plan}, "1.0")])
    _validate_with_ray(after)
    # Ray keeps replicas when only num_replicas, autoscaling, user_config or max_ongoing_requests change: the
    # application's args (hashed into the code version) must stay the same
    assert before["applications"][1]["args"] == after["applications"][1]["args"]
    [old], [new] = before["applications"][1]["deployments"], after["applications"][1]["deployments"]
    changed = {key for key in {*old, *new} if old.get(key) != new.get(key)}
    assert changed == {"user_config", "max_ongoing_requests"}
    assert {k: v for k, v in new["user_config"].items() if k != "model"} == {
        "batch_size": 8,
        "max_batch_delay_ms": 5,
        "num_threads": 1,
    }
    assert new["max_ongoing_requests"] == max_ongoing_requests(8)


def test_workers_default_and_models_json_precedence(tmp_path: Path) -> None:
    sleep_archive(tmp_path, model_config={"maxBatchDelay": 7})
    models_json = json.dumps({"sleep": {"1.0": {"batchSize": 3, "maxBatchDelay": 900}}})
    [model] = plan_models(_config(tmp_path, default_workers_per_model="3", models=models_json), ("sleep=sleep.mar",))
    plan = model.get("1.0")
    # models= JSON < model-config.yaml, as on the native server
    assert (plan.batch_size, plan.max_batch_delay_ms) == (3, 7)
    [deployment] = serve_config([model])["applications"][1]["deployments"]
    assert deployment["num_replicas"] == 3 and "autoscaling_config" not in deployment
    assert deployment["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0}


def test_two_versions_are_an_application_each_the_defaults_at_the_models_route(tmp_path: Path) -> None:
    sleep_archive(tmp_path, name="m", version="1.0")
    (tmp_path / "m.mar").rename(tmp_path / "m1.mar")
    sleep_archive(tmp_path, name="m", version="2.0")
    [model] = plan_models(_config(tmp_path), ("m1.mar", "m.mar"))
    assert model.default_version == "1.0" and sorted(model.versions) == ["1.0", "2.0"]
    config = serve_config([model])
    _validate_with_ray(config)
    apps = config["applications"][1:]
    assert [(a["name"], a["route_prefix"]) for a in apps] == [("m_v1_0", "/predictions/m"), ("m_v2_0", None)]
    assert [[d["name"] for d in a["deployments"]] for a in apps] == [["m_v1_0"], ["m_v2_0"]]
    assert [a["args"]["version"]["version"] for a in apps] == ["1.0", "2.0"]
    assert all(a["deployments"][0]["user_config"]["model"]["default"] == "1.0" for a in apps)
    with pytest.raises(Exception, match="does not exist for model: m"):
        model.get("3.0")


def test_another_versions_registration_scaling_and_default_leave_a_versions_args_alone(tmp_path: Path) -> None:
    """Ray hashes an application's args into its code version: a change of them replaces every replica of the
    application. A version's application keeps its args (and import path) whatever happens to the model's other
    versions; what it is told of them is its ``user_config``, and the default's route moves with the default."""
    model = _two_versions(tmp_path)
    alone = ModelPlan("m", {"1.0": model.versions["1.0"]}, "1.0")
    idle = ModelPlan("m", {**model.versions, "2.0": model.versions["2.0"].scaled(0, 0)}, "1.0")
    second = replace(model, default_version="2.0")
    configs = [serve_config([m]) for m in (alone, model, idle, second)]
    for config in configs:
        _validate_with_ray(config)
    v1 = [next(a for a in c["applications"] if a["name"] == "m_v1_0") for c in configs]
    assert all((a["args"], a["import_path"]) == (v1[0]["args"], v1[0]["import_path"]) for a in v1)
    assert [a["route_prefix"] for a in v1] == ["/predictions/m", "/predictions/m", "/predictions/m", None]
    assert [a["deployments"][0]["user_config"]["model"]["deployed"] for a in v1] == [
        ["1.0"],
        ["1.0", "2.0"],
        ["1.0"],
        ["1.0", "2.0"],
    ]
    assert "m_v2_0" not in [a["name"] for a in configs[2]["applications"]]  # 0 workers: no application


def test_the_frontend_name_is_reserved(tmp_path: Path) -> None:
    sleep_archive(tmp_path, name="servetune")
    with pytest.raises(ApiError, match="reserved"):
        plan_models(_config(tmp_path), ("servetune.mar",))


def test_cli_writes_a_serve_deploy_config(tmp_path: Path) -> None:
    store = tmp_path / "store"
    sleep_archive(store, model_config={"minWorkers": 2, "maxWorkers": 2})
    out = tmp_path / "serve.yaml"
    args = ["serve", "--backend", "ray", "--dt", "--model-store", str(store), "--models", "all"]
    result = CliRunner().invoke(cli, [*args, "--ray-serve-config", str(out)])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(out.read_text())
    _validate_with_ray(written)
    [app] = [a for a in written["applications"] if a["name"] == "sleep_v1_0"]
    assert app["import_path"] == "servetune.ray.app:model_app"
    assert app["deployments"][0]["num_replicas"] == 2


def test_without_ray_the_cli_says_how_to_install_it(tmp_path: Path) -> None:
    done = run_cli_without_ray(["serve", "--backend", "ray", "--dt", "--model-store", str(tmp_path)])
    assert done.returncode == 2, done.stderr
    assert "pip install 'servetune[ray]'" in done.stderr


def test_an_unreadable_start_up_model_is_reported_and_skipped(tmp_path: Path) -> None:
    sleep_archive(tmp_path)
    (tmp_path / "broken.mar").write_bytes(b"not a zip")
    reported: list[tuple[str, str]] = []
    plans = plan_models(
        _config(tmp_path), ("sleep.mar", "broken.mar", "gone=missing.mar"), lambda m, e: reported.append((m, str(e)))
    )
    assert [p.name for p in plans] == ["sleep"]
    assert [m for m, _ in reported] == ["broken.mar", "gone"]
    assert "Model not found in model store: missing.mar" in reported[1][1]
    with pytest.raises(Exception, match="missing.mar"):
        plan_models(_config(tmp_path), ("gone=missing.mar",))


def test_the_replica_queue_holds_two_batches_unless_the_model_config_says(tmp_path: Path) -> None:
    sleep_archive(tmp_path, model_config={"batchSize": 4})
    sleep_archive(tmp_path, name="one", model_config={"batchSize": 4, "rayOngoingBatches": 1})
    sleep_archive(tmp_path, name="bad", model_config={"rayOngoingBatches": 0})
    plans = plan_models(_config(tmp_path), ("sleep.mar", "one.mar"))
    ongoing = {p.name: p.get(None).ongoing_batches for p in plans}
    assert ongoing == {"sleep": 2, "one": 1}
    apps = {app["name"]: app for app in serve_config(plans)["applications"][1:]}
    assert apps["sleep_v1_0"]["deployments"][0]["max_ongoing_requests"] == 8
    assert apps["one_v1_0"]["deployments"][0]["max_ongoing_requests"] == 4
    with pytest.raises(ApiError, match=r"rayOngoingBatches=0: expected an integer 1\.\.64"):
        plan_models(_config(tmp_path), ("bad.mar",))


CONTROLLED = {"slo": {"p99_ms": 200}, "bounds": {"batch_size": [1, 16]}, "shed": True}


@pytest.mark.parametrize(
    ("controller", "key"),
    [
        ({**CONTROLLED, "bounds": {"workers": [1, 4]}}, "controller.bounds.workers"),
        ({**CONTROLLED, "bounds": {"threads": [1, 2]}}, "controller.bounds.threads"),
        ({**CONTROLLED, "policy": "queue"}, "controller.policy"),
        ({**CONTROLLED, "policy": "static", "static": {"batch_size": 4, "workers": 2}}, "controller.static.workers"),
        ({**CONTROLLED, "policy": "oracle", "phases": [{"batch_size": 2, "workers": 3}]}, "controller.phases"),
        ({**CONTROLLED, "slo": {"p99_ms": -1}}, "controller.slo.p99_ms"),
    ],
)
def test_a_controller_setting_a_replica_cannot_honour_is_refused_naming_the_key(
    tmp_path: Path, controller: dict[str, Any], key: str
) -> None:
    sleep_archive(tmp_path, model_config={"controller": controller})
    with pytest.raises(ApiError, match=re.escape(key)) as refused:
        plan_models(_config(tmp_path), ("sleep.mar",))
    assert refused.value.status == 400


def test_a_controlled_replica_holds_two_batches_at_the_controllers_largest(tmp_path: Path) -> None:
    # workers [1, 1]: one worker is what each replica's controller sees of itself; the replicas stay Ray's to scale
    bounds = {"batch_size": [1, 16], "workers": [1, 1]}
    sleep_archive(tmp_path, model_config={"batchSize": 4, "controller": {**CONTROLLED, "bounds": bounds}})
    [model] = plan_models(_config(tmp_path), ("sleep.mar",))
    version = model.get(None)
    assert version.control is not None and version.control.shed and version.batch_limit == 16
    [app] = serve_config([model])["applications"][1:]
    assert app["deployments"][0]["max_ongoing_requests"] == 32  # two batches of the controller's upper bound
    assert app["deployments"][0]["user_config"]["batch_size"] == 4  # the registered size, until the controller moves


def test_a_replicas_load_failure_is_told_without_the_stacks_ray_quotes() -> None:
    message = (
        "The deployment failed to start 3 times in a row. See controller logs for details. Error:\n"
        "ray::ServeReplica:m:m_v1_0.initialize_and_get_metadata() (pid=7861)\n"
        'Traceback (most recent call last):\n  File "replica.py", line 133, in __init__\n    check(x)\n'
        "servetune._exceptions.ConfigError: controller.slo.p99_ms=100 is below the model's batch-1 time\n"
    )
    assert without_traceback(message) == (
        "The deployment failed to start 3 times in a row. See controller logs for details. Error: "
        "servetune._exceptions.ConfigError: controller.slo.p99_ms=100 is below the model's batch-1 time"
    )
    assert without_traceback("no replicas could be placed") == "no replicas could be placed"


def _two_versions(store: Path) -> ModelPlan:
    sleep_archive(store, name="m", version="1.0")
    (store / "m.mar").rename(store / "m1.mar")
    sleep_archive(store, name="m", version="2.0")
    [model] = plan_models(_config(store), ("m1.mar", "m.mar"))
    return model


def test_what_the_frontend_and_replicas_are_told_round_trips_through_the_config_file(tmp_path: Path) -> None:
    model = _two_versions(tmp_path)
    idle = ModelPlan("m", {**model.versions, "2.0": model.versions["2.0"].scaled(0, 0)}, "1.0")
    server = _config(tmp_path, max_request_size="1234")
    config = yaml.safe_load(yaml.safe_dump(serve_config([idle], server=server)))  # as `serve deploy` reads it
    frontend, app = config["applications"]  # only the deployed version has an application

    shipped = VersionArgs.from_json(app["args"])
    assert shipped.plan == model.versions["1.0"].plan and shipped.server.max_request_size == 1234
    assert json.loads(json.dumps(shipped.to_json())) == app["args"]
    told_replica = served_model(app["deployments"][0]["user_config"], shipped.plan)
    assert told_replica == idle.served == ServedModel("m", "1.0", ("1.0", "2.0"), ("1.0",))

    told = FrontendArgs.of_application(frontend)
    assert told.models == (idle.served,) and told.server.max_request_size == 1234 and not told.starting
    assert told.to_json() == frontend["args"] and told.user_config() == frontend["deployments"][0]["user_config"]


def test_the_frontend_is_told_of_start_up_and_models_in_place(tmp_path: Path) -> None:
    """Ray hashes an application's args into its code version (a change replaces the replicas) and applies a change
    of ``user_config`` in place: what changes as the server starts and models come and go is in the user_config, so
    the replica answering ``/ping`` is never replaced by a registration or by the end of start-up."""
    sleep_archive(tmp_path, name="m")
    sleep_archive(tmp_path, name="other")
    model, other = plan_models(_config(tmp_path), ("m.mar", "other.mar"))
    starting = serve_config([model], starting=True)["applications"][0]
    started = serve_config([model, other], failed={"x": "bad"})["applications"][0]
    assert starting["args"] == started["args"] and starting["import_path"] == started["import_path"]
    assert starting["deployments"][0]["user_config"] != started["deployments"][0]["user_config"]
    assert FrontendArgs.of_application(starting).starting
    told = FrontendArgs.of_application(started)
    assert [m.name for m in told.models] == ["m", "other"] and told.failed == {"x": "bad"} and not told.starting


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda m: m.update(default="9.0"), "default version '9.0' is not one of"),
        (lambda m: m.update(deployed=["1.0", "3.0"]), "are not all in"),
        (lambda m: m.pop("default"), "expected a served model"),
        (lambda m: m.update(versions="1.0"), "must be lists of version strings"),
    ],
)
def test_a_hand_edited_model_in_a_user_config_is_refused_with_the_reason(
    tmp_path: Path, edit: Callable[[dict[str, Any]], object], reason: str
) -> None:
    [_, app, _] = serve_config([_two_versions(tmp_path)])["applications"]
    user_config = app["deployments"][0]["user_config"]
    edit(user_config["model"])
    with pytest.raises(ValueError, match=reason):
        served_model(user_config, VersionArgs.from_json(app["args"]).plan)


def test_a_hand_edited_version_application_without_its_plan_is_refused(tmp_path: Path) -> None:
    [_, app, _] = serve_config([_two_versions(tmp_path)])["applications"]
    with pytest.raises(ValueError, match="version: expected the version's plan"):
        VersionArgs.from_json({"server": app["args"]["server"]})


def test_the_kuberay_example_ships_args_the_builders_read() -> None:
    example = yaml.safe_load((Path(__file__).parents[1] / "deploy" / "rayservice.yaml").read_text())
    config = yaml.safe_load(example["spec"]["serveConfigV2"])
    _validate_with_ray(config)
    frontend, app = config["applications"]
    [served] = FrontendArgs.of_application(frontend).models
    shipped = VersionArgs.from_json(app["args"])
    assert served == served_model(app["deployments"][0]["user_config"], shipped.plan)
    assert served.name == shipped.plan.name == "resnet18" and app["route_prefix"] == "/predictions/resnet18"
    assert app["name"] == deployment_name("resnet18", "1.0") == "resnet18_v1_0"
    assert [d["name"] for d in app["deployments"]] == ["resnet18_v1_0"]
