"""Input decoding and output encoding rules."""

from __future__ import annotations

import io
import json

import pytest
import torch

from servetune.handlers.codec import UnsupportedOutputError, decode_value, encode_value, error_body, mime_type
from servetune.handlers.util import BadInputError


@pytest.mark.parametrize(
    ("content_type", "data", "expected"),
    [
        ("application/json", b'{"a": 1}', {"a": 1}),
        ("Application/JSON; charset=UTF-8", b"[1, 2]", [1, 2]),
        ("text/plain", "é".encode(), "é"),
        ("text/csv; charset=utf-8", b"a,b", "a,b"),
        ("text/plain", b"\xff", bytearray(b"\xff")),
        ("image/jpeg", b"\xff\xd8", bytearray(b"\xff\xd8")),
        (None, b"x", bytearray(b"x")),
        ("", b"x", bytearray(b"x")),
    ],
)
def test_decode(content_type: str | None, data: bytes, expected: object) -> None:
    value = decode_value("body", content_type, data)
    assert value == expected and type(value) is type(expected)


def test_decode_bad_json_and_decoding_off() -> None:
    with pytest.raises(BadInputError, match="data is not valid JSON") as info:
        decode_value("data", "application/json", b"{")
    assert info.value.error_code == 400
    with pytest.raises(BadInputError):
        decode_value("body", "application/json", b"\xff")
    assert decode_value("body", "application/json", b"{", decode=False) == bytearray(b"{")


def test_encode() -> None:
    assert encode_value(b"ab") == (b"ab", None)
    assert encode_value(bytearray(b"ab")) == (b"ab", None)
    assert encode_value("é") == ("é".encode(), None)
    body, kind = encode_value(torch.tensor([1.5, 2.5]))
    assert kind is None and torch.equal(torch.load(io.BytesIO(body), weights_only=True), torch.tensor([1.5, 2.5]))
    assert encode_value({"a": [1]}) == (b'{\n  "a": [\n    1\n  ]\n}', "application/json")
    assert encode_value(None) == (b"null", "application/json")
    with pytest.raises(UnsupportedOutputError):
        encode_value({1, 2})


def test_error_body_and_mime() -> None:
    assert json.loads(error_body(503, "InternalServerException", "Prediction failed")) == {
        "code": 503,
        "type": "InternalServerException",
        "message": "Prediction failed",
    }
    assert mime_type(" Text/Plain ; q=1") == "text/plain" and mime_type(None) == ""
