"""The gRPC messages and services servetune speaks, built from the ``.proto`` files in this folder.

    inference.proto              org.pytorch.serve.grpc.inference.InferenceAPIsService    (TorchServe, port 7070)
    management.proto             org.pytorch.serve.grpc.management.ManagementAPIsService  (TorchServe, port 7071)
    open_inference_grpc.proto    inference.GRPCInferenceService     (the Open Inference Protocol, KServe v2)
    grpc/health/v1/health.proto  grpc.health.v1.Health              (Kubernetes' gRPC probes)

The classes are made at import from the compiled descriptors (``_descriptors.py``, written by
``scripts/gen_protos``) in a pool of servetune's own: no protobuf gencode/runtime version check applies, and a
process may also hold a client's stubs of the same protos (TorchServe's, tritonclient's ``inference`` package)
without a clash. Neutral: the API layer serves these, the load engines send them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from servetune.protos._descriptors import FILE_DESCRIPTOR_SET

PROTO_FILES = ("inference.proto", "management.proto", "open_inference_grpc.proto", "grpc/health/v1/health.proto")

POOL = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode("".join(FILE_DESCRIPTOR_SET))).file:
    POOL.Add(_file)


def message(full_name: str) -> Any:
    """The message class of ``full_name`` (e.g. ``inference.ModelInferRequest``)."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


@dataclass(frozen=True)
class Method:
    """One RPC: its path on the wire, its message classes and which sides stream."""

    service: str
    name: str
    request: Any
    response: Any
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


def methods(service: str) -> dict[str, Method]:
    """Every RPC of ``service`` (a full name, e.g. ``inference.GRPCInferenceService``), by method name."""
    found = POOL.FindServiceByName(service)
    return {
        m.name: Method(
            service,
            m.name,
            message_factory.GetMessageClass(m.input_type),
            message_factory.GetMessageClass(m.output_type),
            m.client_streaming,
            m.server_streaming,
        )
        for m in found.methods
    }


# The Open Inference Protocol's datatypes -> the ``InferTensorContents`` field that carries them (None: raw only).
CONTENTS_FIELDS: dict[str, str | None] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP16": None,
    "BF16": None,
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

TORCHSERVE_INFERENCE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
TORCHSERVE_MANAGEMENT = "org.pytorch.serve.grpc.management.ManagementAPIsService"
OIP = "inference.GRPCInferenceService"
HEALTH = "grpc.health.v1.Health"

__all__ = [
    "CONTENTS_FIELDS",
    "HEALTH",
    "OIP",
    "POOL",
    "PROTO_FILES",
    "TORCHSERVE_INFERENCE",
    "TORCHSERVE_MANAGEMENT",
    "Method",
    "message",
    "methods",
]
