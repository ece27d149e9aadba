"""Predictions below ASGI (servetune.api.http1's direct routes, api/rest.py's ``DirectCall``): which requests the
protocol starts itself once their body is in, which it leaves to the ASGI app, and that a real server answers both
ways alike (TorchServe's error shapes, limits, forms, paths)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.responses import PlainTextResponse

from http_client import call, uvicorn_thread
from kserve_models import build_store
from models import sleep_archive
from servetune.api.http1 import CLIENT_GONE_KEY, DIRECT_BODY_MAX, REGULAR_APP, OneWriteCycle
from servetune.api.http_limits import HeaderLimits, guarded_protocol
from servetune.embedded import EmbeddedServer
from test_api_kserve import (  # noqa: F401 (collected here too: the same cases on the native backend)
    LIMIT,
    test_v1_bad_requests_get_kserve_errors,
    test_v1_predict_hands_the_handler_the_instances_and_answers_predictions,
    test_v2_bad_requests_get_oip_errors,
    test_v2_gzip_request_bodies_are_read,
    test_v2_infer_binary_both_ways_with_parameters_and_chosen_outputs,
    test_v2_infer_json_as_torchserves_kservev2_envelope_answers,
    test_v2_unknown_models_and_versions_are_404,
)
from test_api_kserve import Server as KServeServer

READ_TIMEOUT_S = 10.0


# ---- the protocol, over a real socket, with routes made for the test ------------------------------------------------


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Every request the protocol leaves to ASGI: ``asgi:`` and the whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"asgi:" + body
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def direct_answer(cycle: OneWriteCycle) -> None:
    """``/direct``: ``direct:`` and the body, written on a later turn of the loop (as a batch's answer is)."""
    body = bytes(cycle.body)
    asyncio.get_running_loop().call_soon(cycle.write_now, 200, [(b"content-type", b"text/plain")], b"direct:" + body)


def scope_answer(cycle: OneWriteCycle) -> None:
    """``/scope``: what the route saw of its request (the scope's fields a route reads, and the body), as JSON, on a
    later turn of the loop."""
    scope = cycle.scope
    seen: dict[str, Any] = {
        key: scope[key]  # type: ignore[literal-required]
        for key in ("type", "http_version", "scheme", "root_path", "method", "path", "server")
    }
    seen["raw_path"] = scope["raw_path"].decode("latin-1")
    seen["query_string"] = scope["query_string"].decode("latin-1")
    seen["headers"] = [[n.decode("latin-1"), v.decode("latin-1")] for n, v in scope["headers"]]
    seen["client_host"] = scope["client"][0] if scope["client"] else None
    seen["asgi"] = scope["asgi"]
    seen["body"] = bytes(cycle.body).decode("latin-1")
    seen["client_gone"] = scope[CLIENT_GONE_KEY]()  # type: ignore[literal-required]
    answer = json.dumps(seen).encode()
    asyncio.get_running_loop().call_soon(cycle.write_now, 200, [(b"content-type", b"application/json")], answer)


def later_answer(cycle: OneWriteCycle) -> None:
    """``/later``: ``later:`` and the body, 0.3 s after the request started."""
    body = bytes(cycle.body)
    asyncio.get_running_loop().call_later(0.3, cycle.write_now, 200, [], b"later:" + body)


def match(scope: Any) -> Any:
    path = scope["path"]
    if path == "/direct":
        return direct_answer
    if path == "/scope":
        return scope_answer
    if path == "/later":
        return later_answer
    if path == "/decline":
        return lambda cycle: REGULAR_APP
    if path == "/refuse":
        return lambda cycle: PlainTextResponse("refused", status_code=418)
    return None


class CountingProtocol(guarded_protocol(HeaderLimits(), match)):  # type: ignore[misc]
    """The test's protocol, counting the requests the fast way took (``direct_whole``)."""

    fast = 0

    def direct_whole(self, data: bytes) -> bool:
        took: bool = super().direct_whole(data)
        CountingProtocol.fast += took
        return took


@pytest.fixture(scope="module")
def protocol() -> Iterator[tuple[str, int]]:
    with uvicorn_thread(asgi_app, CountingProtocol) as port:
        yield "127.0.0.1", port


def head(path: str, length: int | None, extra: str = "", version: str = "1.1") -> bytes:
    lines = [f"POST {path} HTTP/{version}", "Host: 127.0.0.1", "Content-Type: text/plain"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def read_reply(reader: Any) -> tuple[int, dict[str, str], bytes]:
    status_line = reader.readline()
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader.read(int(headers.get("content-length", "0")))


def exchange(address: tuple[str, int], *writes: bytes, replies: int = 1, gap_s: float = 0.0) -> list[tuple[Any, ...]]:
    with socket.create_connection(address, timeout=READ_TIMEOUT_S) as sock:
        for data in writes:
            sock.sendall(data)
            time.sleep(gap_s)
        reader = sock.makefile("rb")
        out = [read_reply(reader) for _ in range(replies)]
        reader.close()
        return out


def test_a_small_body_is_answered_by_the_direct_route_and_the_connection_stays_open(protocol: tuple[str, int]) -> None:
    with socket.create_connection(protocol, timeout=READ_TIMEOUT_S) as sock:
        reader = sock.makefile("rb")
        for body in (b"one", b"", b"two"):
            sock.sendall(head("/direct", len(body)) + body)
            status, headers, answer = read_reply(reader)
            assert (status, answer) == (200, b"direct:" + body)
            assert headers["content-length"] == str(len(answer)) and "connection" not in headers
        reader.close()


def test_the_direct_route_waits_for_a_body_that_arrives_after_its_head(protocol: tuple[str, int]) -> None:
    body = b"x" * 1000
    [(status, _, answer)] = exchange(protocol, head("/direct", len(body)), body[:10], body[10:], gap_s=0.05)
    assert (status, answer) == (200, b"direct:" + body)


def test_http10_keep_alive_holds_on_the_direct_route(protocol: tuple[str, int]) -> None:
    [(status, headers, answer)] = exchange(protocol, head("/direct", 2, "Connection: keep-alive\r\n", "1.0") + b"hi")
    assert (status, answer, headers["connection"]) == (200, b"direct:hi", "keep-alive")


@pytest.mark.parametrize(
    ("request_bytes", "answer"),
    [
        # past the size the protocol waits for: read as it arrives, by the app
        (head("/direct", DIRECT_BODY_MAX + 1) + b"y" * (DIRECT_BODY_MAX + 1), b"asgi:" + b"y" * (DIRECT_BODY_MAX + 1)),
        # no declared length
        (head("/direct", None, "Transfer-Encoding: chunked\r\n") + b"3\r\nabc\r\n0\r\n\r\n", b"asgi:abc"),
        # the route declines it, or answers it with an ASGI response
        (head("/decline", 3) + b"abc", b"asgi:abc"),
        (head("/refuse", 3) + b"abc", b"refused"),
        # not a direct route's path
        (head("/other", 3) + b"abc", b"asgi:abc"),
    ],
    ids=["large", "chunked", "declined", "refused", "other"],
)
def test_what_the_direct_route_does_not_take_goes_to_asgi(
    protocol: tuple[str, int], request_bytes: bytes, answer: bytes
) -> None:
    [(status, _, got)] = exchange(protocol, request_bytes)
    assert got == answer and status == (418 if answer == b"refused" else 200)


def test_expect_100_continue_is_left_to_asgi_which_sends_the_interim_answer(protocol: tuple[str, int]) -> None:
    with socket.create_connection(protocol, timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(head("/direct", 3, "Expect: 100-continue\r\n"))
        reader = sock.makefile("rb")
        # uvicorn sends 100 Continue when the app first asks for the body
        assert reader.readline().startswith(b"HTTP/1.1 100")
        assert reader.readline() == b"\r\n"
        sock.sendall(b"abc")
        assert read_reply(reader)[2] == b"asgi:abc"
        reader.close()


def test_pipelined_requests_are_answered_in_order(protocol: tuple[str, int]) -> None:
    """The first starts on the direct route; those queued behind it start, in order, as each answer completes."""
    pipelined = b"".join(head("/direct", len(b)) + b for b in (b"a", b"bb", b"ccc"))
    replies = exchange(protocol, pipelined, replies=3)
    assert [answer for _, _, answer in replies] == [b"direct:a", b"asgi:bb", b"asgi:ccc"]


@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("target", ["/scope", "/sc%6Fpe?x=1&y=%20z"])
def test_a_request_whole_in_one_read_is_seen_as_one_that_came_in_parts(
    protocol: tuple[str, int], target: str, version: str
) -> None:
    """A request whose head and body come in one read takes the fast way (its own parser, no uvicorn callbacks);
    sent in three reads it takes the usual one: the route sees the same request either way."""
    extra = "X-Trailing:  spaced \t\r\nConnection: keep-alive\r\n"
    whole = head(target, 5, extra, version) + b"hello"
    fast = CountingProtocol.fast
    [(status, _, one_read)] = exchange(protocol, whole)
    assert CountingProtocol.fast == fast + 1
    [(status_parts, _, in_parts)] = exchange(protocol, whole[:20], whole[20:-2], whole[-2:], gap_s=0.05)
    assert CountingProtocol.fast == fast + 1
    assert status == status_parts == 200
    seen, seen_parts = json.loads(one_read), json.loads(in_parts)
    assert seen == seen_parts
    assert seen["path"] == "/scope" and seen["method"] == "POST" and seen["http_version"] == version
    assert ["x-trailing", "spaced"] in seen["headers"] and seen["body"] == "hello" and seen["client_gone"] is False


def test_a_whole_request_past_a_head_limit_is_refused_as_one_in_parts(protocol: tuple[str, int]) -> None:
    """The fast way takes only heads within the limits; past one, the usual way's refusal answers (431 here)."""
    many = "".join(f"X-H{i}: v\r\n" for i in range(HeaderLimits().count + 1))
    [(status, headers, _)] = exchange(protocol, head("/direct", 2, many) + b"hi")
    assert status == 431 and headers["connection"] == "close"


def test_a_request_that_comes_while_the_last_is_answered_waits_its_turn(protocol: tuple[str, int]) -> None:
    """The fast way starts a request only between requests: one read while the request before it is still being
    answered is queued (pipelined) and answered after it, in order."""
    fast = CountingProtocol.fast
    replies = exchange(protocol, head("/later", 1) + b"a", head("/direct", 2) + b"bb", replies=2, gap_s=0.05)
    assert [answer for _, _, answer in replies] == [b"later:a", b"asgi:bb"]
    assert CountingProtocol.fast == fast + 1  # the first


def test_many_whole_requests_on_one_connection_are_each_answered(protocol: tuple[str, int]) -> None:
    fast = CountingProtocol.fast
    with socket.create_connection(protocol, timeout=READ_TIMEOUT_S) as sock:
        reader = sock.makefile("rb")
        for i in range(200):
            body = b"%d" % i
            sock.sendall(head("/direct", len(body)) + body)
            assert read_reply(reader)[2] == b"direct:" + body
        reader.close()
    assert CountingProtocol.fast == fast + 200


# ---- a real server: the direct way and the ASGI way answer alike ----------------------------------------------------


@pytest.fixture(scope="module")
def servetune(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    tmp = tmp_path_factory.mktemp("direct")
    sleep_archive(tmp / "store", batch_ms=0)
    properties = {
        "disable_token_authorization": "true",
        "default_workers_per_model": "1",
        "max_request_size": "1000",
    }
    with EmbeddedServer(tmp / "store", {"sleep": "sleep.mar"}, properties, workdir=tmp / "server") as server:
        yield server


@pytest.mark.parametrize("path", ["/predictions/sleep", "/predictions/sleep/", "/predictions/sleep/1.0"])
def test_predictions_on_every_path_form(servetune: EmbeddedServer, path: str) -> None:
    reply = call("POST", servetune.inference_url + path, b"hello", {"x-request-id": "rid-1"})
    assert reply.status == 200 and reply.json()["echo"] == "hello"
    assert reply.headers["x-request-id"] == "rid-1" and reply.headers["x-servetune-batch-size"] == "1"


def test_a_form_body_is_still_parsed_into_its_fields(servetune: EmbeddedServer) -> None:
    reply = call(
        "POST",
        servetune.inference_url + "/predictions/sleep",
        b"data=from+a+form",
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert reply.status == 200 and reply.json()["echo"] == "from a form"


def test_torchserve_error_shapes_hold_on_the_direct_way(servetune: EmbeddedServer) -> None:
    too_large = call("POST", servetune.inference_url + "/predictions/sleep", b"z" * 1001)  # over max_request_size
    assert too_large.status == 413 and too_large.json()["code"] == 413
    unknown = call("POST", servetune.inference_url + "/predictions/nobody", b"hello")
    assert unknown.status == 404 and json.loads(unknown.body)["type"] == "ModelNotFoundException"
    failed = call("POST", servetune.inference_url + "/predictions/sleep", b"boom")
    assert failed.status == 503 and failed.json() == {
        "code": 503,
        "type": "InternalServerException",
        "message": "Prediction failed",
    }
    timeout = call("POST", servetune.inference_url + "/predictions/sleep", b"hello", {"x-servetune-timeout-ms": "-1"})
    assert timeout.status == 400 and "x-servetune-timeout-ms" in timeout.json()["message"]


# ---- KServe's protocols on a real server: test_api_kserve.py's cases (run there in process over a fake backend,
# which takes the ASGI way), here on the native backend, whose predictions take the direct way ------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServeServer]:
    tmp = tmp_path_factory.mktemp("kserve-direct")
    models = build_store(tmp / "store")
    properties = {
        "default_workers_per_model": "1",
        "max_request_size": str(LIMIT),
        "disable_token_authorization": "true",
    }
    with EmbeddedServer(tmp / "store", models, properties, workdir=tmp / "server") as running:
        yield KServeServer(running, "native")  # type: ignore[arg-type]
