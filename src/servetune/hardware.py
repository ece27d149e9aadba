"""What this host has: GPUs (counted without importing torch) and physical CPU cores, and what a process of it holds
in memory. Neutral: any layer may ask."""

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


def process_memory(pid: int) -> tuple[int, int | None]:
    """(RSS, PSS) of a process in bytes: resident memory, and its proportional share (a page shared by N processes
    counts 1/N to each), from ``/proc/PID/smaps_rollup``; PSS is None where the kernel does not tell (not Linux,
    or before 4.14), RSS then from psutil; (0, None) for a process that is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            text = fh.read()
    except OSError:
        try:
            return int(psutil.Process(pid).memory_info().rss), None
        except (psutil.Error, ValueError):
            return 0, None
    fields: dict[bytes, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(b":")
        if key in (b"Rss", b"Pss"):
            fields[key] = int(rest.split()[0]) * 1024  # kB
    return fields.get(b"Rss", 0), fields.get(b"Pss")


__all__ = ["detect_gpus", "physical_cores", "process_memory", "usable_cpus"]
