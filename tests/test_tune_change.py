"""``plan_change``: the management API steps that move a served model from one config to another, for every knob and
every kind of target (servetune native, servetune on Ray, TorchServe, a server whose model API is off). Pure: a table
of (from, to, capabilities) -> steps, each worked out by hand from what the target's API can change."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from servetune._exceptions import ConfigError
from servetune.tune.change import (
    NATIVE,
    RAY,
    TORCHSERVE,
    Capabilities,
    Register,
    Scale,
    Served,
    Unregister,
    Update,
    archive_of,
    plan_change,
)
from servetune.tune.study import Config

BASE = Config("eager/cpu", workers=2, batch_size=4, batch_delay_ms=10)
API_OFF_SERVETUNE = Capabilities(can_register=False, can_rebatch=True, knobs_in_place=True)
API_OFF_TORCHSERVE = Capabilities(can_register=False, can_rebatch=False, knobs_in_place=False)
SERVETUNE_KINDS = {"native": NATIVE, "ray": RAY}


def at(**changes: Any) -> Config:
    return dataclasses.replace(BASE, **changes)


def served(config: Config, capabilities: Capabilities) -> Served:
    return Served(archive_of(config, capabilities), config)


# (what changes, the wanted config, the steps on a servetune server — the same on both backends)
SERVETUNE_TABLE = [
    ("nothing", BASE, ()),
    ("more workers", at(workers=3), (Scale(3),)),
    ("fewer workers", at(workers=1), (Scale(1),)),
    ("batch size", at(batch_size=8), (Update(2, (("batch_size", 8), ("max_batch_delay", 10))),)),
    ("batch delay", at(batch_delay_ms=50), (Update(2, (("batch_size", 4), ("max_batch_delay", 50))),)),
    ("batch size and workers", at(batch_size=8, workers=1), (Update(1, (("batch_size", 8), ("max_batch_delay", 10))),)),
    ("threads", at(threads=2), (Update(2, (("num_threads", 2),)),)),
    ("inter-op threads", at(inter_op_threads=1), (Update(2, (("inter_op_threads", 1),)),)),
    ("threads with fewer workers", at(threads=1, workers=1), (Scale(1), Update(1, (("num_threads", 1),)))),
    ("threads with more workers", at(threads=1, workers=3), (Update(3, (("num_threads", 1),)),)),
    (
        "batching and threads",
        at(batch_size=2, threads=1),
        (Update(2, (("batch_size", 2), ("max_batch_delay", 10), ("num_threads", 1))),),
    ),
    (
        "family",
        at(family="torchscript/cpu"),
        (Unregister(), Register("torchscript/cpu", at(family="torchscript/cpu"), 2)),
    ),
    (
        "family with threads",
        at(family="torchscript/cpu", threads=2),
        (
            Unregister(),
            Register("torchscript/cpu", at(family="torchscript/cpu", threads=2), 0),
            Update(2, (("num_threads", 2),)),
        ),
    ),
]


@pytest.mark.parametrize("backend", sorted(SERVETUNE_KINDS))
@pytest.mark.parametrize(("change", "wanted", "steps"), SERVETUNE_TABLE, ids=[row[0] for row in SERVETUNE_TABLE])
def test_a_servetune_server_changes_every_knob_in_place_and_registers_only_a_new_family(
    backend: str, change: str, wanted: Config, steps: tuple[object, ...]
) -> None:
    capabilities = SERVETUNE_KINDS[backend]
    assert plan_change(served(BASE, capabilities), wanted, capabilities) == steps


def test_pinning_changes_in_place_on_the_native_server_and_is_refused_on_ray() -> None:
    wanted = at(pinning=True, threads=1)
    assert plan_change(served(BASE, NATIVE), wanted, NATIVE) == (
        Update(2, (("num_threads", 1), ("cpu_pinning", "true"))),
    )
    assert plan_change(served(wanted, NATIVE), BASE, NATIVE) == (
        Update(2, (("num_threads", 0), ("cpu_pinning", "false"))),
    )
    with pytest.raises(ConfigError, match=r"eager/cpu\|w2\|b4\|d10\|t1\|pin: this server cannot pin workers"):
        plan_change(served(BASE, RAY), wanted, RAY)


# TorchServe with its model API on: no batching in place, no thread knobs in place (it does not echo them): both
# need a registration, the knobs from a copy of the archive with them written into its model-config.yaml.
TORCHSERVE_TABLE = [
    ("nothing", BASE, ()),
    ("workers", at(workers=4), (Scale(4),)),
    ("batch size", at(batch_size=8), (Unregister(), Register("eager/cpu", at(batch_size=8), 2))),
    ("batch delay", at(batch_delay_ms=0), (Unregister(), Register("eager/cpu", at(batch_delay_ms=0), 2))),
    ("threads", at(threads=2), (Unregister(), Register("eager/cpu|threads=2", at(threads=2), 2))),
    (
        "pinning and inter-op threads",
        at(pinning=True, inter_op_threads=1),
        (Unregister(), Register("eager/cpu|inter_op_threads=1|pinning=True", at(pinning=True, inter_op_threads=1), 2)),
    ),
    (
        "family",
        at(family="onnx/cpu", workers=1),
        (Unregister(), Register("onnx/cpu", at(family="onnx/cpu", workers=1), 1)),
    ),
]


@pytest.mark.parametrize(("change", "wanted", "steps"), TORCHSERVE_TABLE, ids=[row[0] for row in TORCHSERVE_TABLE])
def test_torchserve_registers_again_for_batching_and_thread_knobs(
    change: str, wanted: Config, steps: tuple[object, ...]
) -> None:
    assert plan_change(served(BASE, TORCHSERVE), wanted, TORCHSERVE) == steps


def test_a_knob_archive_is_left_for_the_family_archive_when_the_knobs_go_back_to_automatic() -> None:
    threaded = at(threads=2, workers=1)
    assert plan_change(served(threaded, TORCHSERVE), at(workers=3), TORCHSERVE) == (
        Unregister(),
        Register("eager/cpu", at(workers=3), 3),
    )
    # the same knobs on another worker count: the same archive, so only a scale
    assert plan_change(served(threaded, TORCHSERVE), at(threads=2, workers=2), TORCHSERVE) == (Scale(2),)


def test_the_first_trial_registers_and_unregisters_a_model_found_there() -> None:
    assert plan_change(None, BASE, NATIVE) == (Register("eager/cpu", BASE, 2),)
    assert plan_change(None, BASE, NATIVE, registered=True) == (Unregister(), Register("eager/cpu", BASE, 2))
    assert plan_change(None, at(threads=1), NATIVE) == (Register("eager/cpu", at(threads=1), 0),
                                                        Update(2, (("num_threads", 1),)))  # fmt: skip


def test_a_server_whose_model_api_is_off_only_rebatches_in_place_or_scales() -> None:
    # servetune with its model API off: batching in place, even on the first trial (the family is what it serves)
    assert plan_change(None, at(batch_size=8), API_OFF_SERVETUNE) == (
        Update(2, (("batch_size", 8), ("max_batch_delay", 10))),
    )
    assert plan_change(served(BASE, API_OFF_SERVETUNE), at(batch_size=1, workers=1), API_OFF_SERVETUNE) == (
        Update(1, (("batch_size", 1), ("max_batch_delay", 10))),
    )
    # TorchServe with its model API off: only the workers
    assert plan_change(None, at(workers=3), API_OFF_TORCHSERVE) == (Scale(3),)
    assert plan_change(served(BASE, API_OFF_TORCHSERVE), at(workers=1), API_OFF_TORCHSERVE) == (Scale(1),)


def test_every_step_sequence_reaches_the_wanted_config() -> None:
    """Run each plan on a model of the server's state (what each step sets) and compare with the wanted config."""

    def run(state: dict[str, Any], steps: tuple[object, ...]) -> dict[str, Any]:
        state = dict(state)
        for step in steps:
            if isinstance(step, Unregister):
                state = {}
            elif isinstance(step, Register):
                c = step.config
                written = step.archive != c.family  # the knobs come with the archive
                state = dataclasses.asdict(c if written else dataclasses.replace(c, threads=0, inter_op_threads=0,
                                                                                  pinning=False))  # fmt: skip
                state["workers"] = step.workers
            elif isinstance(step, Scale):
                state["workers"] = step.workers
            else:
                assert isinstance(step, Update)
                names = {"batch_size": "batch_size", "max_batch_delay": "batch_delay_ms", "num_threads": "threads",
                         "inter_op_threads": "inter_op_threads", "cpu_pinning": "pinning"}  # fmt: skip
                for key, value in step.params:
                    state[names[key]] = value == "true" if key == "cpu_pinning" else value
                state["workers"] = step.workers
        return state

    configs = [row[1] for row in SERVETUNE_TABLE] + [row[1] for row in TORCHSERVE_TABLE]
    for capabilities in (NATIVE, TORCHSERVE):
        for start in configs:
            for wanted in configs:
                if wanted.pinning and not capabilities.pinning:
                    continue
                state = run({}, plan_change(None, start, capabilities))
                state = run(state, plan_change(served(start, capabilities), wanted, capabilities))
                assert state == dataclasses.asdict(wanted), (capabilities, start, wanted)
