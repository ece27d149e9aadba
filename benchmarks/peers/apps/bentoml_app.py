"""BentoML: a service with a batchable API (adaptive batching, max batch size), ``workers`` processes; run with
``bentoml serve bentoml_app:Peer`` (production mode)."""

from __future__ import annotations

import bentoml
from common import BATCH, WORKERS, Model


@bentoml.service(workers=WORKERS, traffic={"timeout": 60})
class Peer:
    def __init__(self) -> None:
        self.model = Model()

    if BATCH > 1:
        # max_latency_ms is BentoML's latency budget for a batch (requests past it are refused), not a wait: a
        # generous one, so that it shapes batches and never sheds
        @bentoml.api(batchable=True, max_batch_size=BATCH, max_latency_ms=60000)
        def predict(self, data: list[str]) -> list[object]:
            return self.model.predict(data)

    else:

        @bentoml.api
        def predict(self, data: str) -> object:
            return self.model.predict([data])[0]
