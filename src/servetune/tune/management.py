"""A small client for TorchServe's management API (servetune's or TorchServe's own): register, scale, describe,
unregister. Blocking, standard library only: the tuner calls it between load runs, never during one."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from servetune._exceptions import ManagementError

__all__ = ["ManagementClient", "ManagementError", "worker_memory"]


class ManagementClient:
    def __init__(self, url: str, headers: Mapping[str, str] | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout = timeout

    def call(self, method: str, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.url}{path}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except (json.JSONDecodeError, AttributeError):
                pass
            raise ManagementError(f"{method} {path}: HTTP {exc.code}: {detail}".strip(), exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ManagementError(f"{method} {url}: cannot reach the management API: {exc}", 0) from None
        return json.loads(body) if body.strip() else None

    def describe(self, model: str) -> dict[str, Any]:
        described = self.call("GET", f"/models/{urllib.parse.quote(model)}")
        if not isinstance(described, list) or not described or not isinstance(described[0], dict):
            raise ManagementError(f"GET /models/{model}: unexpected answer {described!r}", 200)
        entry: dict[str, Any] = described[0]
        return entry

    def register(self, url: str, model: str, *, batch_size: int, max_batch_delay: int, workers: int) -> None:
        self.call(
            "POST",
            "/models",
            url=url,
            model_name=model,
            batch_size=batch_size,
            max_batch_delay=max_batch_delay,
            initial_workers=workers,
            synchronous="true",
        )

    def scale(self, model: str, workers: int) -> None:
        self.call(
            "PUT", f"/models/{urllib.parse.quote(model)}", min_worker=workers, max_worker=workers, synchronous="true"
        )

    def rebatch(self, model: str, *, batch_size: int, max_batch_delay: int, workers: int, **extra: Any) -> bool:
        """Change batching in place and scale, in one call (servetune's extension of the scale API; TorchServe
        ignores the batch parameters). True when the server now reports the new batching. ``extra``: more of
        servetune's parameters for the same call (``num_threads``, ``cpu_pinning``, ``inter_op_threads``)."""
        self.set(model, workers=workers, batch_size=batch_size, max_batch_delay=max_batch_delay, **extra)
        described = self.describe(model)
        return (described.get("batchSize"), described.get("maxBatchDelay")) == (batch_size, max_batch_delay)

    def set(self, model: str, *, workers: int, **params: Any) -> None:
        """Scale to ``workers`` and change ``params`` in the same call (servetune's extensions of the scale API:
        ``batch_size``, ``max_batch_delay``, ``num_threads``, ``cpu_pinning``, ``inter_op_threads``); answered
        once the workers run with them."""
        self.call(
            "PUT",
            f"/models/{urllib.parse.quote(model)}",
            **params,
            min_worker=workers,
            max_worker=workers,
            synchronous="true",
        )

    def rebatch_supported(self, model: str, described: Mapping[str, Any]) -> bool:
        """Whether the server changes batching in place, asked without changing anything: the model's own batch
        size, delay and workers sent back. servetune answers "Batching set ..."; TorchServe ignores the batch
        parameters and answers that it scaled the workers to the number they already are."""
        workers = described.get("workers")
        count = len(workers) if isinstance(workers, list) else int(str(described.get("minWorkers", 1)))
        try:
            answer = self.call(
                "PUT",
                f"/models/{urllib.parse.quote(model)}",
                batch_size=described.get("batchSize"),
                max_batch_delay=described.get("maxBatchDelay"),
                min_worker=count,
                max_worker=max(count, int(str(described.get("maxWorkers", count)))),
                synchronous="true",
            )
        except ManagementError:
            return False
        return isinstance(answer, dict) and str(answer.get("status", "")).startswith("Batching set")

    def unregister(self, model: str) -> None:
        self.call("DELETE", f"/models/{urllib.parse.quote(model)}")

    def model_api_enabled(self) -> bool:
        """Whether register and unregister are allowed, asked without side effects: deleting a model that does not
        exist answers 404 when they are, 405 when they are not."""
        try:
            self.call("DELETE", "/models/servetune-tune-probe-0")
        except ManagementError as exc:
            return exc.status != 405
        return True


def worker_memory(described: Mapping[str, Any], key: str = "memoryUsage") -> int:
    """Bytes of memory used by the model's workers (the describe API's ``memoryUsage``, or servetune's
    ``gpuMemoryUsage``, summed; 0 when the server does not say)."""
    total = 0
    for worker in described.get("workers") or []:
        value = worker.get(key) if isinstance(worker, dict) else None
        if isinstance(value, (int, float)) and value > 0:
            total += int(value)
    return total
