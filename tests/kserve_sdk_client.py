"""Run by test_api_foreign_clients.py inside the kserve venv (scripts/client_venv kserve): KServe's own Python SDK
(``InferenceRESTClient`` for v1 and v2, ``InferenceGRPCClient``) against a servetune server.

    python kserve_sdk_client.py HTTP_URL GRPC_TARGET MODEL LOADING

Prints one JSON line of what it saw with every model ready, then waits for a line on stdin (the test registers the
model LOADING, whose worker takes long to load), then prints one JSON line of what it saw while LOADING is not ready:
each refused call as [status, message, seconds it took].
"""

import asyncio
import json
import sys
import time

import grpc
import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def v2_request(model):
    x = InferInput("input-0", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32), binary_data=False)
    return InferRequest(model, [x], request_id="k1")


async def refused(call):
    """A call that should fail: [HTTP status or gRPC code, message, seconds], or ["OK", the answer, seconds]."""
    start = time.monotonic()
    try:
        answer = await call
    except httpx.HTTPStatusError as exc:
        return [exc.response.status_code, exc.response.json().get("error"), round(time.monotonic() - start, 2)]
    except grpc.RpcError as exc:
        return [exc.code().name, exc.details(), round(time.monotonic() - start, 2)]
    return ["OK", str(answer), round(time.monotonic() - start, 2)]


async def ready_phase(url, target, model):
    v1 = InferenceRESTClient(RESTConfig(protocol="v1", timeout=60))
    v2 = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    rpc = InferenceGRPCClient(target, timeout=60, retries=0)
    seen = {
        "v1": {
            "live": await v1.is_server_live(url),
            "model_ready": await v1.is_model_ready(url, model),
            "predict": await v1.infer(url, {"instances": [[1.0, 2.0]]}, model_name=model),
        },
        "v2": {
            "live": await v2.is_server_live(url),
            "ready": await v2.is_server_ready(url),
            "model_ready": await v2.is_model_ready(url, model),
        },
        "grpc": {
            "live": await rpc.is_server_live(),
            "ready": await rpc.is_server_ready(),
            "model_ready": await rpc.is_model_ready(model),
        },
    }
    answer = await v2.infer(url, v2_request(model), model_name=model)
    seen["v2"]["infer"] = {"id": answer.id, "y": answer.outputs[0].as_numpy().tolist()}
    answer = await rpc.infer(v2_request(model))
    seen["grpc"]["infer"] = {"id": answer.id, "y": answer.outputs[0].as_numpy().tolist()}
    for client in (v1, v2):
        await client.close()
    await rpc.close()
    return seen


async def loading_phase(url, target, model, loading):
    v1 = InferenceRESTClient(RESTConfig(protocol="v1", timeout=60))
    v2 = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    rpc = InferenceGRPCClient(target, timeout=60, retries=0)
    seen = {
        "v1": {
            "live": await v1.is_server_live(url),
            "model_ready": await v1.is_model_ready(url, loading),
            "other_model_ready": await v1.is_model_ready(url, model),
            "predict": await refused(v1.infer(url, {"instances": [[1.0]]}, model_name=loading)),
        },
        "v2": {
            "live": await v2.is_server_live(url),
            "ready": await refused(v2.is_server_ready(url)),
            "model_ready": await v2.is_model_ready(url, loading),
            "infer": await refused(v2.infer(url, v2_request(loading), model_name=loading)),
        },
        "grpc": {
            "live": await rpc.is_server_live(),
            "ready": await rpc.is_server_ready(),
            "model_ready": await rpc.is_model_ready(loading),
            "infer": await refused(rpc.infer(v2_request(loading))),
        },
    }
    for client in (v1, v2):
        await client.close()
    await rpc.close()
    return seen


def main(url, target, model, loading):
    print(json.dumps(asyncio.run(ready_phase(url, target, model))), flush=True)
    sys.stdin.readline()
    print(json.dumps(asyncio.run(loading_phase(url, target, model, loading))), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
