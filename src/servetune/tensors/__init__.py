"""Tensors of the Open Inference Protocol (KServe v2): datatypes, their JSON and binary forms, requests and responses.

One codec for every place that handles OIP tensors: the REST API (JSON bodies and the binary tensor data extension),
the gRPC API (typed ``contents`` and ``raw_input_contents`` are the binary form below), the worker-side envelopes
that hand tensors to handlers, and the load generator. numpy only; no HTTP, no protobuf.

A :class:`Tensor` holds a C-ordered numpy array of its shape: BYTES elements are ``bytes`` in an object array; BF16
(which numpy lacks) is held as float32 and rounded to bfloat16 when encoded. JSON data may be nested or flat; the
element count must equal the shape's product (one dimension may be ``-1`` in a request: inferred from the data, as
numpy's reshape does, for TorchServe's own samples). Binary data is little-endian, row-major, unpadded; BOOL is one
byte; a BYTES element is a 4-byte little-endian length then its bytes. Every error is a :class:`TensorError` whose
message names the tensor and what was expected: a server answers it 400.

Limits (``servetune.tensor_limits``, the server's ``max_tensor_*`` keys) are checked on a tensor's shape before any
of its data is decoded; over one: ``TensorLimitError`` (a server answers 413). JSON is strict: ``NaN`` and
``Infinity`` are not JSON, and a number a datatype cannot hold (FP16 ``1e10``) is refused rather than made infinite.

Two modules, re-exported here: ``datatypes`` (the datatypes, :class:`Tensor`, :class:`TensorMetadata`, one tensor's
data in its JSON and binary forms) and ``wire`` (REST request and response bodies: JSON, or JSON then binary data).
"""

from __future__ import annotations

from servetune.tensor_limits import DEFAULT_LIMITS, NO_LIMITS, TensorError, TensorLimitError, TensorLimits, strict_json
from servetune.tensors.datatypes import (
    BINARY_PARAMETERS,
    DATATYPES,
    Tensor,
    TensorMetadata,
    datatype_of,
    decode_binary_data,
    decode_json_data,
    numpy_dtype,
)
from servetune.tensors.wire import (
    HEADER_LENGTH,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    encode_request,
    encode_response,
    parse_header_length,
    parse_request,
    parse_response,
    split_body,
)

__all__ = [
    "BINARY_PARAMETERS",
    "DATATYPES",
    "DEFAULT_LIMITS",
    "NO_LIMITS",
    "HEADER_LENGTH",
    "InferenceRequest",
    "InferenceResponse",
    "RequestedOutput",
    "Tensor",
    "TensorError",
    "TensorLimitError",
    "TensorLimits",
    "TensorMetadata",
    "datatype_of",
    "decode_binary_data",
    "decode_json_data",
    "encode_request",
    "encode_response",
    "numpy_dtype",
    "parse_header_length",
    "parse_request",
    "parse_response",
    "split_body",
    "strict_json",
]
