"""Where an answer's time went, as servetune's servers send it and its clients read it: three fields, sent as response
headers on REST and as trailing metadata on gRPC, named here once (lower case: gRPC's metadata keys are; HTTP header
names are case-insensitive).

Neutral: the API's gateway writes them (``servetune.api.gateway`` ``Answer.timing``: values in milliseconds with three
decimals, the batch size as an integer), the load engines read them (``servetune.bench``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

QUEUE_MS = "x-servetune-queue-ms"  # accepted -> its batch sent to a worker, milliseconds
HANDLER_MS = "x-servetune-handler-ms"  # the handler's time on the whole batch, milliseconds
BATCH_SIZE = "x-servetune-batch-size"  # requests in the batch it ran in
# sent by a client: how long it waits for the answer (milliseconds from the request's arrival); the server's
# controller sheds at once a request predicted to miss it (REST; gRPC has its own deadline)
TIMEOUT_MS = "x-servetune-timeout-ms"


def read_timing(fields: Mapping[str, str]) -> tuple[float, float, int]:
    """(queue ms, handler ms, batch size) from an answer's headers or trailing metadata (lower-case keys); NaN, NaN
    and 0 for what is absent or not a number."""
    batch = _number(fields.get(BATCH_SIZE))
    return _number(fields.get(QUEUE_MS)), _number(fields.get(HANDLER_MS)), 0 if math.isnan(batch) else int(batch)


def _number(value: str | None) -> float:
    try:
        return float(value) if value is not None else math.nan
    except ValueError:
        return math.nan


__all__ = ["BATCH_SIZE", "HANDLER_MS", "QUEUE_MS", "TIMEOUT_MS", "read_timing"]
