"""How a trial's requests reach the model: the wire protocol, as the model's real callers will use it
(``load.protocol``, ``--protocol``). One name -> the address, path and bench engine of each:

| protocol | request | engine |
|---|---|---|
| ``torchserve`` (default) | ``POST /predictions/MODEL``, the input as the body (or multipart) | the load's |
| ``kserve-v1`` | ``POST /v1/models/MODEL:predict``, the input a JSON body (``{"instances": [...]}``) | async |
| ``v2-json`` | ``POST /v2/models/MODEL/infer``, an OIP request as JSON (input: ``.npy`` or ``.json``) | oip-json |
| ``v2-binary`` | the same, with the binary tensor data extension | oip-binary |
| ``v2-grpc`` | OIP ``ModelInfer`` on the gRPC inference port | grpc |
| ``torchserve-grpc`` | TorchServe's ``Predictions`` on the gRPC inference port | grpc |

A protocol is part of what a trial measures (its fingerprint), since a model answers each at its own cost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Protocol:
    grpc: bool  # on the gRPC inference port (else the HTTP inference address)
    path: str  # with {model}
    engine: str | None  # the bench engine; None: the load's own (torchserve's HTTP API, where ab can run too)

    def url(self, http: str, grpc: str | None, model: str) -> str | None:
        """The request URL, or None when the server has no gRPC port to offer."""
        base = grpc if self.grpc else http
        return None if base is None else base.rstrip("/") + self.path.format(model=model)


PROTOCOLS: dict[str, Protocol] = {
    "torchserve": Protocol(False, "/predictions/{model}", None),
    "kserve-v1": Protocol(False, "/v1/models/{model}:predict", "async"),
    "v2-json": Protocol(False, "/v2/models/{model}/infer", "oip-json"),
    "v2-binary": Protocol(False, "/v2/models/{model}/infer", "oip-binary"),
    "v2-grpc": Protocol(True, "/v2/models/{model}/infer", "grpc"),
    "torchserve-grpc": Protocol(True, "/predictions/{model}", "grpc"),
}
DEFAULT = "torchserve"
