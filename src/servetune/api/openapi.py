"""OpenAPI 3.0.1 documents answered by ``OPTIONS /``: they describe exactly the routes served."""

from __future__ import annotations

from typing import Any

from servetune import __version__
from servetune.api.kserve_openapi import kserve_paths

_ERROR = {
    "type": "object",
    "required": ["code", "type", "message"],
    "properties": {"code": {"type": "integer"}, "type": {"type": "string"}, "message": {"type": "string"}},
}
_STATUS = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Bad request",
        403: "Forbidden",
        404: "Not found",
        405: "Method not allowed",
        409: "Conflict",
        413: "Body too large",
        500: "Internal error",
        503: "No worker or queue full",
        504: "Timed out",
        507: "Out of memory",
    }
    return {str(c): _json(_ERROR, text[c]) for c in codes}


def _info(title: str) -> dict[str, Any]:
    return {"openapi": "3.0.1", "info": {"title": title, "version": __version__}}


def _path_param(name: str) -> dict[str, Any]:
    return {"in": "path", "name": name, "required": True, "schema": {"type": "string"}}


def inference_spec(models: list[str] | None = None) -> dict[str, Any]:
    body = {
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {"type": "object", "properties": {"data": {"type": "string", "format": "binary"}}}
            },
        }
    }
    prediction = {
        "requestBody": body,
        "responses": {"200": {"description": "The handler's output"}, **_errors(400, 404, 413, 500, 503, 504, 507)},
    }
    predict_ops: dict[str, dict[str, Any]] = {
        "post": {"operationId": "predictions", **prediction},
        "put": {"operationId": "predictionsPut", **prediction},
    }
    spec = _info("servetune inference API")
    spec["paths"] = {
        "/": {"options": {"operationId": "apiDescription", "responses": {"200": {"description": "This document"}}}},
        "/ping": {
            "get": {
                "operationId": "ping",
                "responses": {"200": _json(_STATUS, "Healthy"), "500": _json(_STATUS, "Unhealthy")},
            }
        },
        "/predictions/{model_name}": {"parameters": [_path_param("model_name")], **predict_ops},
        "/predictions/{model_name}/{model_version}": {
            "parameters": [_path_param("model_name"), _path_param("model_version")],
            **{k: {**v, "operationId": f"{v['operationId']}Version"} for k, v in predict_ops.items()},
        },
    }
    explain_ops: dict[str, dict[str, Any]] = {
        k: {**v, "operationId": str(v["operationId"]).replace("predictions", "explanations")}
        for k, v in predict_ops.items()
    }
    versioned: dict[str, Any] = {k: {**v, "operationId": f"{v['operationId']}Version"} for k, v in explain_ops.items()}
    spec["paths"]["/explanations/{model_name}"] = {"parameters": [_path_param("model_name")], **explain_ops}
    spec["paths"]["/explanations/{model_name}/{model_version}"] = {
        "parameters": [_path_param("model_name"), _path_param("model_version")],
        **versioned,
    }
    for path, operations in kserve_paths().items():
        spec["paths"].setdefault(path, {}).update(operations)
    if models is not None:
        spec["x-models"] = sorted(models)
    return spec


def management_spec() -> dict[str, Any]:
    def query(name: str, kind: str = "string", required: bool = False) -> dict[str, Any]:
        return {"in": "query", "name": name, "required": required, "schema": {"type": kind}}

    describe = {"type": "array", "items": {"type": "object"}}
    scale = ["min_worker", "max_worker", "synchronous", "batch_size", "max_batch_delay", "num_threads"]
    scale += ["inter_op_threads", "cpu_pinning"]

    def model_ops(suffix: str) -> dict[str, Any]:
        """describe / scale / unregister of ``/models/{name}`` (suffix "") and ``/models/{name}/{version}``."""
        booleans = ("synchronous", "cpu_pinning")
        return {
            "get": {
                "operationId": f"describeModel{suffix}",
                "responses": {"200": _json(describe, "Model"), **_errors(400, 404)},
            },
            "put": {
                "operationId": f"setAutoScale{suffix}",
                "parameters": [query(n, "boolean" if n in booleans else "integer") for n in scale],
                "responses": {
                    "200": _json(_STATUS, "Scaled"),
                    "202": _json(_STATUS, "Accepted"),
                    **_errors(400, 404, 500),
                },
            },
            "delete": {
                "operationId": f"unregisterModel{suffix}",
                "responses": {"200": _json(_STATUS, "Unregistered"), **_errors(400, 403, 404, 405)},
            },
        }

    spec = _info("servetune management API")
    spec["paths"] = {
        "/": {"options": {"operationId": "apiDescription", "responses": {"200": {"description": "This document"}}}},
        "/models": {
            "get": {
                "operationId": "listModels",
                "parameters": [query("limit", "integer"), query("next_page_token", "integer")],
                "responses": {"200": _json({"type": "object"}, "Model list"), **_errors(400)},
            },
            "post": {
                "operationId": "registerModel",
                "parameters": [
                    query("url", required=True),
                    query("model_name"),
                    query("handler"),
                    query("runtime"),
                    query("batch_size", "integer"),
                    query("max_batch_delay", "integer"),
                    query("initial_workers", "integer"),
                    query("synchronous", "boolean"),
                    query("response_timeout", "integer"),
                    query("startup_timeout", "integer"),
                ],
                "responses": {
                    "200": _json(_STATUS, "Registered"),
                    "202": _json(_STATUS, "Accepted"),
                    **_errors(400, 404, 405, 409, 500),
                },
            },
        },
        "/models/{model_name}": {"parameters": [_path_param("model_name")], **model_ops("")},
        "/models/{model_name}/{model_version}": {
            "parameters": [_path_param("model_name"), _path_param("model_version")],
            **model_ops("Version"),
        },
        "/models/{model_name}/{model_version}/set-default": {
            "parameters": [_path_param("model_name"), _path_param("model_version")],
            "put": {"operationId": "setDefault", "responses": {"200": _json(_STATUS, "Updated"), **_errors(400, 404)}},
        },
    }
    return spec
