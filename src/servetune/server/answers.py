"""A batch's answers, from its worker's result to each request's future: one answer per request, or one error each
(504 when the worker timed out, 503 when it died or broke the one-result-per-request invariant), intermediate
answers to a stream, the batch-size metric, and the handler's time per batch (a moving average the pool reads)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from servetune._exceptions import ApiError, WorkerDied, WorkerTimeout
from servetune.api.types import InferResult
from servetune.server.batcher import Job
from servetune.server.messages import Partial, Result
from servetune.server.process import WorkerProcess

if TYPE_CHECKING:
    from servetune.server.model import ServedModel

log = logging.getLogger("servetune.pool")

HANDLER_EWMA = 0.2


class Answers:
    """Answers the batches of one served model."""

    def __init__(self, model: ServedModel, observe_batch: Callable[[int], None] | None = None) -> None:
        self.model = model
        self.observe_batch = observe_batch  # the batch-size metric, observed as each batch ends
        self.handler_ms = math.inf  # the handler's time per batch, a moving average (light models: the pool)

    def deliver(
        self, batch: list[Job], result: Result, started: float, worker: WorkerProcess, at_once: bool = False
    ) -> None:
        """Each request of the batch its answer (one per request, else every request fails); ``at_once``: each
        request's ``on_answer`` runs now (``Job.answer``), not in a later turn of the loop."""
        model = self.model
        if math.isfinite(self.handler_ms):
            self.handler_ms += HANDLER_EWMA * (result.handler_ms - self.handler_ms)
        else:  # the first batch
            self.handler_ms = result.handler_ms
        if len(result.answers) != len(batch):
            message = (
                f"worker {worker.worker_id} answered {len(result.answers)} results for a batch of {len(batch)} "
                "requests (one per request expected); every request of the batch failed"
            )
            log.error("model %s: %s", model.name, message)
            fail(batch, ApiError.unavailable(message))
            return
        for job, answer in zip(batch, result.answers, strict=True):
            if not job.future.done():
                (job.answer if at_once else job.future.set_result)(
                    InferResult(
                        answer.status,
                        answer.body,
                        answer.content_type,
                        answer.headers,
                        queue_ms=(started - job.arrival) * 1000.0,
                        handler_ms=result.handler_ms,
                        batch_size=len(batch),
                        worker_id=worker.worker_id,
                        version=model.version,
                    )
                )
        if self.observe_batch is not None:
            self.observe_batch(len(batch))

    def failed(self, batch: list[Job], worker: WorkerProcess, exc: WorkerTimeout | WorkerDied) -> None:
        """The worker timed out on the batch (it is killed: 504 to each request) or died running it (503)."""
        if isinstance(exc, WorkerTimeout):
            log.error("model %s: %s; replacing the worker", self.model.name, exc)
            worker.kill()
            fail(batch, ApiError.timeout(str(exc)))
        else:
            fail(batch, ApiError.unavailable(f"Worker died while running this request: {exc}"))

    def partials(self, batch: list[Job], worker_id: str) -> Callable[[Partial], None]:
        """Hands each intermediate answer of the batch to its request's ``on_partial`` (dropped when it has none,
        or it is answered already)."""
        streams = {j.request.request_id: j for j in batch if j.request.on_partial is not None}
        version = self.model.version

        def deliver(partial: Partial) -> None:
            job = streams.get(partial.request_id)
            if job is None or job.future.done() or job.request.on_partial is None:
                return
            a = partial.answer
            try:
                job.request.on_partial(
                    InferResult(
                        a.status, a.body, a.content_type, a.headers, batch_size=1, worker_id=worker_id, version=version
                    )
                )
            except Exception:  # the consumer's failure must not break the worker's connection
                log.exception("model %s: a streaming consumer failed", self.model.name)

        return deliver


def fail(jobs: list[Job], error: ApiError) -> None:
    """Each job not answered yet gets ``error``."""
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)


class Delivery:
    """A batch's answers given in the worker's read callback, the moment its result is read (``WorkerProcess.send``),
    for a batch sent alone when no request waits in the queue: each answer goes out in that turn of the loop, not two
    turns later after the slot's task has resumed. When requests wait, it declines and the slot's task delivers as
    before, after sending the worker its next batch (the worker is not kept idle while answers are written). A
    failure of ours in the callback fails the batch's requests still waiting (503), as a failure in the slot's task
    would."""

    __slots__ = ("answers", "batch", "started", "worker", "done")

    def __init__(self, answers: Answers, batch: list[Job], started: float, worker: WorkerProcess) -> None:
        self.answers = answers
        self.batch = batch
        self.started = started
        self.worker = worker
        self.done = False

    def __call__(self, result: Result) -> None:
        answers = self.answers
        if len(answers.model.batcher):
            return
        self.done = True
        try:
            answers.deliver(self.batch, result, self.started, self.worker, at_once=True)
        except Exception as exc:  # a bug of ours must not leave the batch's requests waiting
            log.exception("model %s: batch failed in the frontend", answers.model.name)
            fail(self.batch, ApiError.unavailable(f"Batch failed in the frontend: {exc!r}"))
