"""``GET /models/{name}``: a backend's :class:`ModelStatus` as TorchServe's describe JSON (one object per version)."""

from __future__ import annotations

import time
from typing import Any

from servetune.api.types import ModelStatus, WorkerStatus


def _time(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(epoch_s))


def _gpu_usage(worker: WorkerStatus) -> str:
    """TorchServe's ``gpuUsage`` string (it asks nvidia-smi; here it is the worker's CUDA allocator's peak)."""
    if worker.gpu_id is None:
        return "N/A"
    return f"gpuId::{worker.gpu_id} memory.used [MiB]::{worker.gpu_memory_bytes // 2**20} MiB"


def describe_worker(worker: WorkerStatus) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": worker.id,
        "startTime": _time(worker.start_time),
        "status": worker.status,
        "memoryUsage": worker.memory_bytes,  # RSS, as TorchServe's
        "pid": worker.pid,
        "gpu": worker.gpu_id is not None,
        "gpuId": worker.gpu_id,
        "gpuUsage": _gpu_usage(worker),
        "gpuMemoryUsage": worker.gpu_memory_bytes,
        "restarts": worker.restarts,
    }
    if worker.pss_bytes is not None:
        out["memoryPss"] = worker.pss_bytes  # servetune's: what the worker costs once shared pages are split
    if worker.num_threads is not None:
        out["numThreads"] = worker.num_threads
    if worker.inter_op_threads is not None:
        out["interOpThreads"] = worker.inter_op_threads
    if worker.cpu_cores is not None:
        out["cpuCores"] = list(worker.cpu_cores)
    if worker.last_error:
        out["lastError"] = worker.last_error
    return {**out, **worker.extra}


def describe(status: ModelStatus) -> dict[str, Any]:
    plan = status.plan
    config = plan.config
    out: dict[str, Any] = {
        "modelName": plan.name,
        "modelVersion": plan.version,
        "modelUrl": plan.url,
        "runtime": plan.runtime,
        "minWorkers": status.min_workers,
        "maxWorkers": status.max_workers,
        "batchSize": status.batch_size,
        "maxBatchDelay": status.max_batch_delay_ms,
        "responseTimeout": plan.response_timeout_s,
        "startupTimeout": plan.startup_timeout_s,
        "clientTimeoutInMills": config.client_timeout_ms,
        "deviceType": status.device_type,
        "deviceIds": list(config.device_ids),
        "numThreads": status.num_threads,
        "interOpThreads": status.inter_op_threads,
        "cpuPinning": status.cpu_pinning,
        "loadedAtStartup": plan.loaded_at_startup,
        "isDefault": status.is_default,
        "health": {"healthy": status.healthy, "crashLoop": status.crash_loop},
        "workers": [describe_worker(w) for w in status.workers],
    }
    if status.queue_capacity is not None:
        out["jobQueueStatus"] = {
            "remainingCapacity": max(0, status.queue_capacity - (status.queue_pending or 0)),
            "pendingRequests": status.queue_pending or 0,
        }
    return {**out, **status.extra}


__all__ = ["describe", "describe_worker"]
