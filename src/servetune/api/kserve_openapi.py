"""The KServe v1 and Open Inference Protocol v2 REST routes in the OpenAPI document that ``OPTIONS /`` serves.

Schemas follow the OIP's own ``open_inference_rest.yaml`` (kserve/open-inference-protocol), with the routes as
servetune serves them: unversioned and versioned paths, ``{name}`` path parameters (the OIP file writes
``${MODEL_NAME}``), and every error status servetune answers, each with KServe's ``{"error": "..."}`` body. The binary
tensor data extension (``Inference-Header-Content-Length``) is described, not modelled: a JSON schema cannot say
where the JSON part ends.
"""

from __future__ import annotations

from typing import Any

from servetune.tensors import DATATYPES

_STRING = {"type": "string"}
_PARAMETERS = {"type": "object", "additionalProperties": True}
_ERROR = {"type": "object", "required": ["error"], "properties": {"error": _STRING}}
_SHAPE = {"type": "array", "items": {"type": "integer"}}
_METADATA_TENSOR = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {"name": _STRING, "datatype": {"type": "string", "enum": list(DATATYPES)}, "shape": _SHAPE},
}
_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": _STRING,
        "shape": _SHAPE,
        "datatype": {"type": "string", "enum": list(DATATYPES)},
        "parameters": _PARAMETERS,
        "data": {"type": "array", "items": {}},
    },
}
_INFERENCE_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": _STRING,
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": _TENSOR, "minItems": 1},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": _STRING, "parameters": _PARAMETERS},
            },
        },
    },
}
_INFERENCE_RESPONSE = {
    "type": "object",
    "required": ["model_name", "id", "outputs"],
    "properties": {
        "model_name": _STRING,
        "model_version": _STRING,
        "id": _STRING,
        "parameters": _PARAMETERS,
        "outputs": {"type": "array", "items": _TENSOR},
    },
}
_MODEL_METADATA = {
    "type": "object",
    "required": ["name", "platform", "inputs", "outputs"],
    "properties": {
        "name": _STRING,
        "versions": {"type": "array", "items": _STRING},
        "platform": _STRING,
        "inputs": {"type": "array", "items": _METADATA_TENSOR},
        "outputs": {"type": "array", "items": _METADATA_TENSOR},
    },
}
_SERVER_METADATA = {
    "type": "object",
    "required": ["name", "version", "extensions"],
    "properties": {"name": _STRING, "version": _STRING, "extensions": {"type": "array", "items": _STRING}},
}
_MODELS = {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": _STRING}}}
_READY = {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"}}}
_MODEL_READY = {
    "type": "object",
    "required": ["name", "ready"],
    "properties": {"name": _STRING, "ready": {"type": "boolean"}},
}
_V1_REQUEST = {
    "type": "object",
    "properties": {"instances": {"type": "array", "items": {}}, "inputs": {"type": "array", "items": {}}},
}
_V1_RESPONSE = {
    "type": "object",
    "properties": {"predictions": {"type": "array", "items": {}}, "explanations": {"type": "array", "items": {}}},
}
_ERROR_TEXT = {
    400: "Invalid input",
    404: "No such model or version",
    413: "Body larger than max_request_size",
    415: "Unsupported Content-Encoding",
    500: "Inference error (the handler failed)",
    501: "Not implemented by the handler (explain)",
    503: "Not ready: no worker, a full queue, still loading",
    504: "The handler overran its responseTimeout",
    507: "Response larger than max_response_size",
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): _json(_ERROR, _ERROR_TEXT[code]) for code in codes}


def _get(operation: str, schema: dict[str, Any], description: str, *errors: int) -> dict[str, Any]:
    return {"get": {"operationId": operation, "responses": {"200": _json(schema, description), **_errors(*errors)}}}


def _params(*names: str) -> list[dict[str, Any]]:
    return [{"in": "path", "name": name, "required": True, "schema": {"type": "string"}} for name in names]


def _post(operation: str, request: dict[str, Any], response: dict[str, Any], errors: tuple[int, ...]) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation,
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {"200": _json(response, "The model's answer"), **_errors(*errors)},
        }
    }


def kserve_paths() -> dict[str, Any]:
    """The ``paths`` of KServe v1 and OIP v2 REST (``/``: its GET only; TorchServe's OPTIONS is beside it)."""
    infer_errors = (400, 404, 413, 415, 500, 501, 503, 504, 507)
    binary = {
        "in": "header",
        "name": "Inference-Header-Content-Length",
        "required": False,
        "description": "Binary tensor data extension: the length of the JSON part; the tensors' bytes follow it",
        "schema": {"type": "integer", "minimum": 0},
    }
    alive = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string", "enum": ["alive"]}}}
    paths: dict[str, Any] = {
        "/": _get("kserveLive", alive, "Live (KServe's liveness route)"),
        "/v1/models": _get("kserveV1ListModels", _MODELS, "Registered models"),
        "/v1/models/{model_name}": {
            "parameters": _params("model_name"),
            **_get("kserveV1ModelReady", _MODEL_READY, "Ready", 404, 503),
        },
        "/v1/models/{model_name}:predict": {
            "parameters": _params("model_name"),
            **_post("kserveV1Predict", _V1_REQUEST, _V1_RESPONSE, infer_errors),
        },
        "/v1/models/{model_name}:explain": {
            "parameters": _params("model_name"),
            **_post("kserveV1Explain", _V1_REQUEST, _V1_RESPONSE, infer_errors),
        },
        "/v2/health/live": _get(
            "oipServerLive",
            {"type": "object", "required": ["live"], "properties": {"live": {"type": "boolean"}}},
            "Live",
        ),
        "/v2/health/ready": _get("oipServerReady", _READY, "Ready", 503),
        "/v2": _get("oipServerMetadata", _SERVER_METADATA, "Server metadata"),
        "/v2/models": _get("oipListModels", _MODELS, "Registered models (KServe's extension)"),
    }
    paths["/v2/health/ready"]["get"]["responses"]["503"] = _json(_READY, "Not ready")
    for suffix, names in (("", ("model_name",)), ("/versions/{model_version}", ("model_name", "model_version"))):
        prefix = "/v2/models/{model_name}" + suffix
        tag = "Version" if suffix else ""
        paths[prefix] = {
            "parameters": _params(*names),
            **_get(f"oipModelMetadata{tag}", _MODEL_METADATA, "Model metadata", 404, 503),
        }
        paths[f"{prefix}/ready"] = {
            "parameters": _params(*names),
            **_get(f"oipModelReady{tag}", _MODEL_READY, "Ready", 404, 503),
        }
        paths[f"{prefix}/ready"]["get"]["responses"]["503"] = _json(_MODEL_READY, "Not ready")
        for verb in ("infer", "explain"):
            operation = _post(f"oip{verb.title()}{tag}", _INFERENCE_REQUEST, _INFERENCE_RESPONSE, infer_errors)
            operation["post"]["parameters"] = [binary]
            paths[f"{prefix}/{verb}"] = {"parameters": _params(*names), **operation}
    return paths


__all__ = ["kserve_paths"]
