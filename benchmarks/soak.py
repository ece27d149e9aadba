"""Soak: normal traffic mixed with faults and attacks, and random worker kills; every request must get exactly one
answer, and every normal client its own.

    python benchmarks/soak.py [--minutes 5] [--clients 8] [--kill-every 5]

Normal requests (TorchServe REST, KServe v1, OIP v2, gRPC) each carry a token of their own; the model (a
``BaseHandler``, batching 4) echoes it, so an answer is checked: 200 with its own token as a prediction, else it is a
**wrong** answer (another client's, or an explanation: issue 19's item 1). Mixed in: faults (a handler that raises
or exits, bodies that are oversize, malformed, empty, for a model that does not exist) and attacks (control headers
and gRPC metadata, explanations in the same batches, heads too large or never finished, a ``Transfer-Encoding`` the
server does not speak, ``[10000000, 0]`` tensors, a 6 MB BYTES tensor, NaN, a lone surrogate, a corrupt protobuf).

Prints requests sent and answered, answers by kind and status, and the three counts that must be 0: **hung** (no
answer within the client timeout), **lost** (the connection dropped without an answer) and **wrong**. The exit code
says whether they were.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from models import handler_archive  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402
from servetune.protos import TORCHSERVE_INFERENCE, methods  # noqa: E402
from servetune.tensors import InferenceRequest, Tensor, encode_request  # noqa: E402

MODEL = "echo"
HEADER_TIMEOUT_MS = 2000
# A BaseHandler (request 0's explain/describe header decides for its whole call) that echoes each request's token;
# "boom" raises, "exit" kills the worker.
HANDLER = textwrap.dedent(
    """
    import json
    import os

    from ts.torch_handler.base_handler import BaseHandler


    def token_of(row):
        value = row
        if isinstance(row, dict):
            value = row.get("data") if row.get("data") is not None else row.get("body", row)
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        return value.get("token") if isinstance(value, dict) else str(value)[:40]


    class Echo(BaseHandler):
        def initialize(self, context):
            self.context = context
            self.manifest = context.manifest
            self.initialized = True

        def preprocess(self, data):
            tokens = [token_of(row) for row in data]
            if "exit" in tokens:
                os._exit(3)
            if "boom" in tokens:
                raise ValueError("boom requested")
            return tokens

        def inference(self, data, *args, **kwargs):
            return data

        def postprocess(self, data):
            return [{"kind": "prediction", "token": t} for t in data]

        def explain_handle(self, data_preprocess, raw_data):
            return [{"kind": "explanation", "token": t} for t in data_preprocess]

        def describe_handle(self):
            return {"kind": "description"}
    """
)

JSON = {"Content-Type": "application/json"}
OVERSIZE = b"x" * 7_000_000  # over the default max_request_size (6553500)
MALFORMED = b'--b\r\nContent-Disposition: form-data; name="data"\r\n\r\nno closing boundary'
NORMAL = ("rest", "v1", "v2", "grpc")
KINDS = [  # (weight, name): 70 % normal traffic
    (25, "rest"),
    (15, "v1"),
    (15, "v2"),
    (15, "grpc"),
    # faults
    (3, "boom"),
    (1, "exit"),
    (1, "oversize_body"),
    (2, "malformed"),
    (2, "unknown_model"),
    (2, "empty"),
    # attacks (issue 19)
    (2, "explain_header"),
    (2, "describe_header"),
    (2, "protocol_header"),
    (2, "explanations"),
    (2, "v1_explain"),
    (2, "grpc_control_metadata"),
    (2, "big_header"),
    (1, "slow_header"),
    (1, "gzip_transfer"),
    (2, "empty_expansion"),
    (1, "heavy_bytes"),
    (2, "nan"),
    (1, "surrogate"),
    (2, "corrupt_protobuf"),
]


def heavy_bytes_body() -> tuple[bytes, dict[str, str]]:
    items = np.empty(1_200_000, dtype=object)  # 6 MB of one-byte BYTES elements
    items[:] = [b"x"] * len(items)
    body, length = encode_request(InferenceRequest([Tensor("x", "BYTES", (len(items),), items)]))
    return body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(length)}


class Traffic:
    """One request of each kind, answered as a short outcome: ``ok`` / ``wrong`` for normal requests, the status
    (``431``, ``INVALID_ARGUMENT``) otherwise, ``hung`` or ``lost``."""

    def __init__(self, session: aiohttp.ClientSession, channel: grpc.aio.Channel, base: str, timeout: float) -> None:
        self.session = session
        self.base = base
        self.timeout = timeout
        self.host, port = base.split("//", 1)[1].rsplit(":", 1)
        self.port = int(port)
        method = methods(TORCHSERVE_INFERENCE)["Predictions"]
        self.request_type = method.request
        self.predict = channel.unary_unary(
            method.path,
            request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            response_deserializer=method.response.FromString,
        )
        self.heavy = heavy_bytes_body()
        self.serial = 0

    def token(self) -> str:
        self.serial += 1
        return f"t{self.serial}-{random.getrandbits(32):08x}"

    async def run(self, kind: str) -> str:
        try:
            return await asyncio.wait_for(getattr(self, kind)(), self.timeout)
        except TimeoutError:
            return "hung"
        except (aiohttp.ClientError, ConnectionError):
            return "lost"

    # ---- HTTP and gRPC plumbing ----------------------------------------------------------------------------------

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        async with self.session.post(f"{self.base}{path}", data=body, headers=headers or JSON) as resp:
            return resp.status, await resp.read()

    async def grpc(self, request: Any, metadata: tuple[tuple[str, str], ...] = ()) -> tuple[str, bytes]:
        try:
            response = await self.predict(request, metadata=metadata, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "hung", b""
            return exc.code().name, b""
        return "OK", bytes(response.prediction)

    async def raw(self, head: bytes) -> str:
        """Send a head on a fresh connection (as much as the server takes); the answer's status, or ``lost``."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            try:
                writer.write(head)
                await writer.drain()
            except ConnectionError:
                pass  # refused mid-way: the answer may be waiting
            answer = await reader.read(200)
            return answer[9:12].decode() if answer.startswith(b"HTTP/1.1 ") else "lost"
        finally:
            writer.close()

    @staticmethod
    def checked(status: int | str, body: bytes, token: str, unwrap: Callable[[Any], Any]) -> str:
        if status not in (200, "OK"):
            return f"error-{status}"  # an answer, not a wrong one (a worker killed under it: 503)
        try:
            answer = unwrap(json.loads(body))
        except (ValueError, KeyError, IndexError, TypeError):
            return "wrong"
        return "ok" if answer == {"kind": "prediction", "token": token} else "wrong"

    # ---- normal traffic: each answer checked ---------------------------------------------------------------------

    async def rest(self) -> str:
        token = self.token()
        status, body = await self.post(f"/predictions/{MODEL}", json.dumps({"token": token}).encode())
        return self.checked(status, body, token, lambda a: a)

    async def v1(self) -> str:
        token = self.token()
        status, body = await self.post(
            f"/v1/models/{MODEL}:predict", json.dumps({"instances": [{"token": token}]}).encode()
        )
        return self.checked(status, body, token, lambda a: a["predictions"][0])

    async def v2(self) -> str:
        token = self.token()
        payload = {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": [token]}]}
        status, body = await self.post(f"/v2/models/{MODEL}/infer", json.dumps(payload).encode())
        return self.checked(status, body, token, lambda a: json.loads(a["outputs"][0]["data"][0]))

    async def grpc_normal(self) -> str:
        token = self.token()
        request = self.request_type(model_name=MODEL, input={"data": json.dumps({"token": token}).encode()})
        code, body = await self.grpc(request)
        return "hung" if code == "hung" else self.checked(code, body, token, lambda a: a)

    # ---- faults --------------------------------------------------------------------------------------------------

    async def boom(self) -> str:
        return str((await self.post(f"/predictions/{MODEL}", b'{"token": "boom"}'))[0])

    async def exit(self) -> str:
        return str((await self.post(f"/predictions/{MODEL}", b'{"token": "exit"}'))[0])

    async def oversize_body(self) -> str:
        return str((await self.post(f"/predictions/{MODEL}", OVERSIZE))[0])

    async def malformed(self) -> str:
        return str(
            (await self.post(f"/predictions/{MODEL}", MALFORMED, {"Content-Type": "multipart/form-data; boundary=b"}))[
                0
            ]
        )

    async def unknown_model(self) -> str:
        return str((await self.post("/predictions/nope", b"{}"))[0])

    async def empty(self) -> str:
        return str((await self.post(f"/predictions/{MODEL}", b""))[0])

    # ---- attacks: control data, then limits ----------------------------------------------------------------------

    async def explain_header(self) -> str:
        return str((await self.post(f"/predictions/{MODEL}", b'{"token": "a"}', {**JSON, "explain": "True"}))[0])

    async def describe_header(self) -> str:
        return str((await self.post(f"/predictions/{MODEL}", b'{"token": "a"}', {**JSON, "describe": "True"}))[0])

    async def protocol_header(self) -> str:
        headers = {**JSON, "x-servetune-protocol": "oip-metadata"}
        return str((await self.post(f"/predictions/{MODEL}", b'{"token": "a"}', headers))[0])

    async def explanations(self) -> str:
        return str((await self.post(f"/explanations/{MODEL}", b'{"token": "a"}'))[0])

    async def v1_explain(self) -> str:
        return str((await self.post(f"/v1/models/{MODEL}:explain", b'{"instances": [{"token": "a"}]}'))[0])

    async def grpc_control_metadata(self) -> str:
        request = self.request_type(model_name=MODEL, input={"data": b'{"token": "a"}'})
        meta = (("describe", "True"), ("explain", "True"), ("x-servetune-protocol", "kserve-v1"))
        return (await self.grpc(request, meta))[0]

    async def big_header(self) -> str:
        return await self.raw(b"POST /predictions/echo HTTP/1.1\r\nX-Big: " + b"a" * 2_000_000 + b"\r\n\r\n")

    async def slow_header(self) -> str:
        return await self.raw(b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\n")  # never finished: 408

    async def gzip_transfer(self) -> str:
        head = b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
        return await self.raw(head)

    async def empty_expansion(self) -> str:
        payload = {"inputs": [{"name": "t", "shape": [10_000_000, 0], "datatype": "FP32", "data": []}]}
        return str((await self.post(f"/v2/models/{MODEL}/infer", json.dumps(payload).encode()))[0])

    async def heavy_bytes(self) -> str:
        return str((await self.post(f"/v2/models/{MODEL}/infer", *self.heavy))[0])

    async def nan(self) -> str:
        body = b'{"inputs": [{"name": "t", "shape": [1], "datatype": "FP32", "data": [NaN]}]}'
        return str((await self.post(f"/v2/models/{MODEL}/infer", body))[0])

    async def surrogate(self) -> str:
        body = b'{"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["\\ud800"]}]}'
        return str((await self.post(f"/v2/models/{MODEL}/infer", body))[0])

    async def corrupt_protobuf(self) -> str:
        return (await self.grpc(b"\xff\xff\xff\xff"))[0]


async def soak(
    base: str, grpc_target: str, mgmt: str, minutes: float, clients: int, kill_every: float, timeout: float
) -> collections.Counter[str]:
    rng = random.Random(0)
    weights, names = zip(*KINDS, strict=True)
    results: collections.Counter[str] = collections.Counter()
    sent = 0
    deadline = time.monotonic() + minutes * 60
    kills = 0

    async def client(traffic: Traffic) -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            kind = rng.choices(names, weights)[0]
            sent += 1
            outcome = await traffic.run("grpc_normal" if kind == "grpc" else kind)
            results[f"{kind} {outcome}"] += 1

    async def killer(session: aiohttp.ClientSession) -> None:
        nonlocal kills
        while time.monotonic() < deadline - kill_every:
            await asyncio.sleep(kill_every)
            async with session.get(f"{mgmt}/models/{MODEL}") as resp:
                workers = (await resp.json())[0]["workers"]
            pids = [w["pid"] for w in workers if w["pid"] > 0 and w["status"] == "READY"]
            if pids:
                try:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass

    async def progress() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(15)
            left = max(0.0, deadline - time.monotonic())
            print(f"  {sent} sent, {sum(results.values())} answered, {kills} kills, {left:.0f} s left", flush=True)

    connector = aiohttp.TCPConnector(limit=clients * 2)
    async with aiohttp.ClientSession(connector=connector) as session, grpc.aio.insecure_channel(grpc_target) as channel:
        traffic = Traffic(session, channel, base, timeout)
        await asyncio.gather(*(client(traffic) for _ in range(clients)), killer(session), progress())
    results["_sent"] = sent
    results["_kills"] = kills
    return results


def report(results: collections.Counter[str]) -> bool:
    sent, kills = results.pop("_sent"), results.pop("_kills")
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for key, count in results.items():
        kind, outcome = key.split(" ", 1)
        by_kind[kind][outcome] += count
    answered = sum(count for key, count in results.items() if not key.endswith((" hung", " lost")))
    exits = sum(by_kind["exit"].values())
    print(
        f"sent {sent}, answered {answered}, worker kills {kills} (SIGKILL) + {exits} exit requests (each kills the "
        "worker running it)"
    )
    for kind, outcomes in sorted(by_kind.items()):
        print(f"  {kind:24s} " + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    hung = sum(o["hung"] for o in by_kind.values())
    lost = sum(o["lost"] for o in by_kind.values())
    wrong = sum(by_kind[k]["wrong"] for k in ("rest", "v1", "v2", "grpc"))
    normal = sum(sum(by_kind[k].values()) for k in ("rest", "v1", "v2", "grpc"))
    checked = sum(by_kind[k]["ok"] for k in ("rest", "v1", "v2", "grpc"))
    print(f"normal requests {normal}: {checked} answered with their own token, {normal - checked - wrong} errors")
    print(f"hung {hung} (must be 0), lost {lost} (must be 0), wrong answers to normal clients {wrong} (must be 0)")
    ok = hung == 0 and lost == 0 and wrong == 0 and answered == sent
    print("PASS" if ok else "FAIL")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between worker kills")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout: no answer by then = hung")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        handler_archive(store, MODEL, "echo_handler.py", HANDLER, {"batchSize": 4, "maxBatchDelay": 5})
        props = {
            "disable_token_authorization": "true",
            "default_workers_per_model": "2",
            "default_response_timeout": "30",
            "header_timeout_ms": str(HEADER_TIMEOUT_MS),
        }
        with EmbeddedServer(store, {MODEL: f"{MODEL}.mar"}, props) as server:
            results = asyncio.run(
                soak(
                    server.inference_url,
                    server.grpc_inference_target,
                    server.management_url,
                    args.minutes,
                    args.clients,
                    args.kill_every,
                    args.timeout,
                )
            )
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
