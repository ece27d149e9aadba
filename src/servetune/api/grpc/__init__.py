"""servetune's gRPC APIs: TorchServe's inference and management services, the Open Inference Protocol's
``inference.GRPCInferenceService`` and ``grpc.health.v1.Health``, written once over the ``Backend`` contract (both
backends serve them; on Ray the driver does, reaching replicas through handles). See docs/grpc.md."""

from __future__ import annotations

from servetune.api.grpc.server import GrpcServers

__all__ = ["GrpcServers"]
