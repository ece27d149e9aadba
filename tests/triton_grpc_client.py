"""Run by test_grpc_triton.py inside the tritonclient venv (scripts/client_venv): Triton's own gRPC client against a
servetune OIP gRPC service. Prints one JSON object of what it saw.

    python triton_grpc_client.py HOST:PORT MODEL
    python triton_grpc_client.py HOST:PORT MODEL image FILE    # FILE's bytes as a BYTES tensor of shape [1], raw
"""

import json
import sys

import numpy as np
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException


def main(url: str, model: str) -> dict:
    client = triton.InferenceServerClient(url)
    seen = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready(model),
        "server": client.get_server_metadata(as_json=True),
        "metadata": client.get_model_metadata(model, as_json=True),
    }
    # raw contents: what InferInput.set_data_from_numpy always sends
    x = triton.InferInput("x", [2, 3], "FP32")
    x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    result = client.infer(model, [x], request_id="t1", outputs=[triton.InferRequestedOutput("y")])
    seen["raw"] = {"y": result.as_numpy("y").tolist(), "id": result.get_response().id}
    text = triton.InferInput("x", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"hello", b"world"], dtype=np.object_))
    seen["bytes"] = [b.decode() for b in client.infer(model, [text]).as_numpy("y").tolist()]
    # typed contents, with Triton's own generated messages and stub
    stub = service_pb2_grpc.GRPCInferenceServiceStub(client._channel)
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="x", datatype="INT64", shape=[3])
    tensor.contents.int64_contents.extend([1, 2, 3])
    typed = stub.ModelInfer(request, timeout=60)
    seen["typed"] = {"y": list(typed.outputs[0].contents.int64_contents), "raw": len(typed.raw_output_contents)}
    errors = {}
    for name, call in {
        "unknown_model": lambda: client.infer("nope", [x]),
        "wrong_shape": lambda: _wrong_shape(client, model),
    }.items():
        try:
            call()
            errors[name] = "OK"
        except InferenceServerException as exc:
            errors[name] = exc.status()
    seen["errors"] = errors
    return seen


def _wrong_shape(client, model):
    """Raw contents that do not fill the declared shape (6 floats declared, 4 sent)."""
    x = triton.InferInput("x", [6], "FP32")
    x.set_data_from_numpy(np.zeros(6, np.float32))
    x._raw_content = np.zeros(4, np.float32).tobytes()
    return client.infer(model, [x])


def image(url: str, model: str, path: str) -> dict:
    """An image file as Triton's client sends bytes: one BYTES element in ``raw_input_contents``."""
    client = triton.InferenceServerClient(url)
    data = triton.InferInput("data", [1], "BYTES")
    with open(path, "rb") as fh:
        data.set_data_from_numpy(np.array([fh.read()], dtype=np.object_))
    try:
        result = client.infer(model, [data])
    except InferenceServerException as exc:
        return {"error": [exc.status(), exc.message()]}
    output = result.get_response().outputs[0]
    return {"name": output.name, "shape": list(output.shape), "answer": json.loads(result.as_numpy(output.name)[0])}


if __name__ == "__main__":
    if sys.argv[3:4] == ["image"]:
        print(json.dumps(image(sys.argv[1], sys.argv[2], sys.argv[4])))
    else:
        print(json.dumps(main(sys.argv[1], sys.argv[2])))
