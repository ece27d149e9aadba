"""Inputs: one file or a directory (cycled, sorted), content types, multipart bodies a real parser accepts."""

from __future__ import annotations

from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path

import pytest

from servetune import BenchError
from servetune.bench.payload import guess_content_type, load_payloads


def test_file_raw_body_and_guessed_type(tmp_path: Path) -> None:
    image = tmp_path / "kitten.jpg"
    image.write_bytes(b"\xff\xd8jpeg")
    [payload] = load_payloads(image)
    assert (payload.name, payload.body, payload.content_type) == ("kitten.jpg", b"\xff\xd8jpeg", "image/jpeg")
    [given] = load_payloads(image, content_type="application/jpg")
    assert given.content_type == "application/jpg"
    assert guess_content_type(Path("x.json")) == "application/json"
    assert guess_content_type(Path("x.unknownext")) == "application/octet-stream"


def test_directory_is_sorted_and_skips_hidden(tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt", ".hidden"):
        (tmp_path / name).write_text(name)
    (tmp_path / "sub").mkdir()
    assert [p.name for p in load_payloads(tmp_path)] == ["a.txt", "b.txt"]


def test_missing_and_empty_inputs(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no such file"):
        load_payloads(tmp_path / "nope")
    with pytest.raises(BenchError, match="holds no files"):
        load_payloads(tmp_path)
    assert load_payloads(None)[0].body == b""


def test_multipart_field_parses_back(tmp_path: Path) -> None:
    image = tmp_path / "drawing.png"
    image.write_bytes(b"\x89PNG\r\n--not-a-boundary\r\n" + bytes(range(256)))
    [payload] = load_payloads(image, form_field="data")
    assert payload.content_type is not None and payload.content_type.startswith("multipart/form-data; boundary=")
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {payload.content_type}\r\n\r\n".encode() + payload.body
    )
    [part] = list(message.iter_parts())  # type: ignore[attr-defined]
    assert part.get_param("name", header="content-disposition") == "data"
    assert part.get_filename() == "drawing.png"
    assert part.get_content_type() == "image/png"
    assert part.get_payload(decode=True) == image.read_bytes()
