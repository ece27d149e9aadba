"""What this host has: GPUs (counted without importing torch) and physical CPU cores. Neutral: any layer may ask."""

from __future__ import annotations

import os
import shutil
import subprocess

import psutil


def detect_gpus() -> int:
    """Count NVIDIA GPUs without importing torch (``nvidia-smi -L``); 0 when ``CUDA_VISIBLE_DEVICES`` is empty."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity mask), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


__all__ = ["detect_gpus", "physical_cores", "usable_cpus"]
