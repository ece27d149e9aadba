"""A model whose cost is known, for tuner tests and benchmarks: each batch takes ``a_ms + b_ms * batch_size``, and at
most ``slots`` batches run at once across all workers (file locks in ``lock_dir``), so beyond ``slots`` workers
more workers stop helping, as on a machine with that many cores."""

from __future__ import annotations

import textwrap
from pathlib import Path

from models import handler_archive
from servetune.tune.study import Config

COST_HANDLER = textwrap.dedent(
    """
    import fcntl
    import os
    import time

    _slots = []

    def _acquire():
        while True:
            for fd in _slots:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    continue
            time.sleep(0.0005)

    def handle(data, context):
        cfg = context.model_yaml_config["cost"]
        if data is None:
            for i in range(int(cfg["slots"])):
                _slots.append(os.open(os.path.join(cfg["lock_dir"], f"slot{i}"), os.O_CREAT | os.O_RDWR))
            return None
        fd = _acquire()
        try:
            time.sleep((float(cfg["a_ms"]) + float(cfg["b_ms"]) * len(data)) / 1000.0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return [{"batch_size": len(data)} for _ in data]
    """
)


def cost_archive(store: Path, lock_dir: Path, *, a_ms: float, b_ms: float, slots: int, name: str = "cost") -> Path:
    """Build ``<store>/<name>.mar`` with the known-cost handler."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    cost = {"a_ms": a_ms, "b_ms": b_ms, "slots": slots, "lock_dir": str(lock_dir.resolve())}
    return handler_archive(store, name, "cost_handler.py", COST_HANDLER, {"cost": cost})


def expected_closed_loop(a_ms: float, b_ms: float, slots: int, workers: int, batch: int) -> tuple[float, float]:
    """(throughput req/s, typical latency ms) with batch x workers clients in closed loop: ``min(workers, slots)``
    batches run at once; with more workers than slots the extra batches wait a turn."""
    service = a_ms + b_ms * batch
    running = min(workers, slots)
    rounds = -(-workers // running)
    return running * batch * 1000.0 / service, service * rounds


def best_by_hand(
    space: dict[str, list[int]], *, a_ms: float, b_ms: float, slots: int, sla_ms: float, overhead_ms: float = 0.0
) -> Config:
    """The best config of ``space`` (delay 50 ms) meeting the SLA with 30 ms to spare for a noisy tail, when every
    request also pays ``overhead_ms`` outside the model."""
    feasible = []
    for w in space["workers"]:
        for b in space["batch_size"]:
            throughput, latency = expected_closed_loop(a_ms + overhead_ms, b_ms, slots, w, b)
            if latency <= sla_ms - 30:
                feasible.append((throughput, Config("eager/cpu", w, b, 50)))
    return max(feasible)[1]


def pipeline_by_hand(costs_ms: dict[str, float], workers: dict[str, int], slots: int) -> tuple[float, float]:
    """(pipelines/s, mean latency ms) of models called one after the other, batch 1, in closed loop with one
    client per worker, every call holding one of ``slots`` slots shared by all the models (the cores they share).

    The app is held back by whichever binds first: a model's workers (``workers / cost`` calls/s) or the slots
    (``slots / sum of costs``: each pipeline keeps a slot busy for the sum of its calls). Little's law gives the
    latency: clients / throughput."""
    per_model = min(workers[m] * 1000.0 / cost for m, cost in costs_ms.items())
    shared = slots * 1000.0 / sum(costs_ms.values())
    throughput = min(per_model, shared)
    return throughput, sum(workers.values()) / throughput * 1000.0
