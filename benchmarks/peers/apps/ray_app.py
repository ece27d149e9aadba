"""Ray Serve: a deployment of WORKERS replicas (1 CPU each) with @serve.batch, served by Ray's HTTP proxy."""

from __future__ import annotations

import json
import os
import time

import ray
from common import BATCH, DELAY_MS, MODEL, PORT, WORKERS, Model
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


@serve.deployment(num_replicas=WORKERS, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=4 * BATCH)
class Peer:
    def __init__(self) -> None:
        self.model = Model()

    @serve.batch(max_batch_size=BATCH, batch_wait_timeout_s=DELAY_MS / 1000.0)
    async def run(self, bodies: list[bytes]) -> list[object]:
        return self.model.predict(bodies)

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        answer = await self.run(body) if BATCH > 1 else self.model.predict([body])[0]
        return Response(json.dumps(answer), media_type="application/json")


if __name__ == "__main__":
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(Peer.bind(), name=MODEL, route_prefix=f"/{MODEL}")
    while True:
        time.sleep(3600)
