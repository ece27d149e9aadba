"""Placement without a GPU or many cores: round-robin GPUs, the automatic thread share, disjoint core sets."""

from __future__ import annotations

import pytest

from servetune._exceptions import ApiError, ConfigError
from servetune.api.plan import VersionPlan
from servetune.config.model import ModelConfig
from servetune.config.server import ServerConfig, launcher_threads
from servetune.server.placement import Demand, Placement


def plan(device_type: str | None = None, device_ids: tuple[int, ...] = ()) -> VersionPlan:
    config = ModelConfig(device_type=device_type, device_ids=device_ids)
    return VersionPlan("m", "1.0", "m.mar", "/tmp/m", {}, config, 1, 1, 120, 120, 100)


def placement(cpus: int, physical: int, gpus: int = 0) -> Placement:
    placed = Placement(gpus)
    placed.cpus, placed.physical = list(range(cpus)), physical
    return placed


def test_gpus_round_robin_and_device_ids() -> None:
    placed = placement(8, 8, gpus=2)
    assert [placed.gpu(plan(), slot) for slot in range(4)] == [0, 1, 0, 1]
    assert [placed.gpu(plan(device_ids=(1,)), slot) for slot in range(2)] == [1, 1]
    assert placed.gpu(plan(device_type="cpu"), 0) is None
    assert placement(8, 8, gpus=0).gpu(plan(), 0) is None


def test_threads_share_the_physical_cores_among_every_worker() -> None:
    placed = placement(8, 8)
    placed.demand(("a", "1"), Demand(workers=2, threads=0, pinned=False))
    assert placed.threads(("a", "1")) == 4
    placed.demand(("b", "1"), Demand(workers=2, threads=0, pinned=False))
    assert placed.threads(("a", "1")) == placed.threads(("b", "1")) == 2
    placed.demand(("c", "1"), Demand(workers=1, threads=3, pinned=False))
    assert placed.threads(("c", "1")) == 3  # named threads win
    placed.release(("b", "1"))
    assert placed.threads(("a", "1")) == 2  # 8 cores over a's 2 and c's 1 workers


def test_spare_cores_are_what_the_other_models_workers_leave() -> None:
    placed = placement(8, 4)
    placed.demand(("a", "1"), Demand(workers=1, threads=2, pinned=False))
    assert placed.spare_cores(("a", "1")) == 4  # alone: every physical core
    placed.demand(("b", "1"), Demand(workers=1, threads=0, pinned=False))  # an automatic share counts one
    assert placed.spare_cores(("a", "1")) == 3
    assert placed.spare_cores(("b", "1")) == 2  # a's worker holds 2 threads
    placed.demand(("c", "1"), Demand(workers=3, threads=1, pinned=False))
    assert placed.spare_cores(("a", "1")) == 1  # never under one
    pinned = placement(8, 4)
    pinned.demand(("p", "1"), Demand(workers=1, threads=2, pinned=True))
    assert pinned.spare_cores(("p", "1")) == 8  # pinned: the usable CPUs


def test_pinned_workers_get_disjoint_cores_and_a_demand_that_does_not_fit_is_refused() -> None:
    placed = placement(8, 8)
    placed.demand(("a", "1"), Demand(workers=2, threads=2, pinned=True))
    placed.demand(("b", "1"), Demand(workers=1, threads=3, pinned=True))
    placed.demand(("c", "1"), Demand(workers=4, threads=0, pinned=False))
    assert [placed.cores(("a", "1"), i) for i in range(2)] == [(0, 1), (2, 3)]
    assert placed.cores(("b", "1"), 0) == (4, 5, 6)
    assert placed.cores(("c", "1"), 0) == ()  # not pinned: floats
    with pytest.raises(ApiError, match="cpuPinning: model d version 1 with 2 worker"):
        placed.demand(("d", "1"), Demand(workers=2, threads=1, pinned=True))
    assert placed.cores(("b", "1"), 0) == (4, 5, 6)  # a refused demand changes nothing


def test_torchserve_launcher_keys_are_mapped_or_refused_by_name() -> None:
    assert launcher_threads("--use_logical_core --ncores_per_instance 2") == 2
    assert launcher_threads("--ncores_per_instance=3") == 3
    config = ServerConfig.from_properties(
        {"cpu_launcher_enable": "true", "cpu_launcher_args": "--ncores_per_instance 2"}
    )
    assert (config.cpu_launcher_enable, config.default_threads) == (True, 2)
    with pytest.raises(ConfigError, match="--enable_jemalloc is not supported"):
        ServerConfig.from_properties({"cpu_launcher_args": "--enable_jemalloc"})
    with pytest.raises(ConfigError, match="--ninstances is not supported: set the model's workers"):
        launcher_threads("--ninstances 4")
