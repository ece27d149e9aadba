"""LitServe: a LitAPI with its own batching (max_batch_size, batch_timeout), workers_per_device on the CPU."""

from __future__ import annotations

import litserve as ls
from common import BATCH, DELAY_MS, PORT, WORKERS, Model


class PeerAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.model = Model()

    def decode_request(self, request: dict) -> object:  # type: ignore[type-arg]
        return request["data"]

    def batch(self, inputs: list) -> list:  # type: ignore[type-arg]
        return inputs

    def predict(self, x: object) -> object:
        if BATCH == 1:  # without batching LitServe hands predict one request, not a list
            return self.model.predict([x])[0]
        return self.model.predict(x)  # type: ignore[arg-type]

    def unbatch(self, output: list) -> list:  # type: ignore[type-arg]
        return output

    def encode_response(self, output: object) -> dict:  # type: ignore[type-arg]
        return {"output": output}


if __name__ == "__main__":
    api = PeerAPI(max_batch_size=BATCH, batch_timeout=DELAY_MS / 1000.0)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=WORKERS, timeout=60)
    server.run(host="127.0.0.1", port=PORT, generate_client_file=False, log_level="warning")
