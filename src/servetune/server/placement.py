"""Where each worker runs: its GPU, its intra-op threads, its cores, its environment. One object for the host.

Every served model tells the placement how many workers it wants (``demand``); from the demands of all of them:
- threads: the model's ``numThreads`` (or the server's default), else the physical cores shared by every worker of
  every model (1 worker x 2 threads on 2 cores becomes 2 x 1 when a second worker starts);
- cores (``cpuPinning``): each pinned worker gets its own run of logical CPUs, as many as its threads, disjoint from
  every other pinned worker's (the Intel launcher's instances x cores per instance); a demand that does not fit the
  CPUs this process may use is refused before any worker starts;
- GPUs: round robin over the GPUs (or the model's ``deviceIds``), unless the model is on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from servetune._exceptions import ApiError
from servetune.api.plan import VersionPlan
from servetune.hardware import physical_cores, usable_cpus


@dataclass(frozen=True)
class Demand:
    workers: int
    threads: int  # 0: the automatic share
    pinned: bool


class Placement:
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.cpus = usable_cpus()
        self.physical = physical_cores()
        self._demands: dict[tuple[str, str], Demand] = {}
        self._gpu_counter = 0
        # Counts changes of the demands: what a worker gets (threads, cores) can only change when it does.
        self.generation = 0

    # ---- demands -----------------------------------------------------------------------------

    def check(self, key: tuple[str, str], demand: Demand) -> None:
        """Refuse (ApiError 400) a demand whose pinned workers would not fit the usable CPUs."""
        demands = {**self._demands, key: demand}
        needed = sum(self._threads(d, demands) * d.workers for d in demands.values() if d.pinned)
        if needed > len(self.cpus):
            raise ApiError.bad_request(
                f"cpuPinning: model {key[0]} version {key[1]} with {demand.workers} worker(s) would need {needed} "
                f"cores for all pinned workers, but this server may use {len(self.cpus)} CPU(s) {self.cpus}"
            )

    def demand(self, key: tuple[str, str], demand: Demand) -> None:
        self.check(key, demand)
        self._demands[key] = demand
        self.generation += 1

    def release(self, key: tuple[str, str]) -> None:
        if self._demands.pop(key, None) is not None:
            self.generation += 1

    def _threads(self, demand: Demand, demands: dict[tuple[str, str], Demand]) -> int:
        if demand.threads:
            return demand.threads
        total = sum(d.workers for d in demands.values()) or 1
        return max(1, self.physical // total)

    def spare_cores(self, key: tuple[str, str]) -> int:
        """The cores a model's workers may take between them (its controller's bound on workers x threads): the
        physical cores (pinned: the usable CPUs) less what the other models' workers take, their threads each (an
        automatic share counts one: it shrinks as workers are added); at least 1."""
        demand = self._demands.get(key)
        total = len(self.cpus) if demand is not None and demand.pinned else self.physical
        used = sum(d.workers * max(1, d.threads) for other, d in self._demands.items() if other != key)
        return max(1, total - used)

    # ---- what one worker gets ----------------------------------------------------------------

    def threads(self, key: tuple[str, str]) -> int:
        demand = self._demands.get(key)
        return self._threads(demand, self._demands) if demand is not None else 1

    def cores(self, key: tuple[str, str], position: int) -> tuple[int, ...]:
        """The cores of the ``position``-th active worker of a model; () when it is not pinned (or does not fit:
        ``check`` refuses that before it can happen)."""
        offset = 0
        for other, demand in self._demands.items():
            if not demand.pinned:
                continue
            size = self._threads(demand, self._demands)
            if other == key:
                if position >= demand.workers:
                    return ()
                start = offset + position * size
                return tuple(self.cpus[start : start + size]) if start + size <= len(self.cpus) else ()
            offset += size * demand.workers
        return ()

    def gpu(self, plan: VersionPlan, slot_id: int) -> int | None:
        if plan.config.device_type == "cpu" or self.gpus == 0:
            return None
        if plan.config.device_ids:
            usable = [i for i in plan.config.device_ids if i < self.gpus]
            if usable:
                return usable[slot_id % len(usable)]
        gpu = self._gpu_counter % self.gpus
        self._gpu_counter += 1
        return gpu

    @staticmethod
    def environment(threads: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
        return env


__all__ = ["Demand", "Placement"]
