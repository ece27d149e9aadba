"""load_service and Service.predict: handler resolution, input decoding, output encoding, error isolation."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from servetune._exceptions import HandlerError
from servetune.handlers import Control, InputParam, Request, Response, Service, load_service, uninstall_ts_alias
from servetune.handlers.loader import heavy_imports


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # load_service puts the model dir on sys.path and installs the ts alias: undo both for other tests
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    uninstall_ts_alias()


def make_service(
    tmp_path: Path,
    source: str,
    handler: str = "handler.py",
    filename: str = "handler.py",
    batch_size: int = 4,
    **kwargs: Any,
) -> Service:
    model_dir = tmp_path / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    target = model_dir / filename
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(textwrap.dedent(source))
    manifest = {"runtime": "python", "model": {"modelName": "m", "handler": handler, "modelVersion": "1.0"}}
    return load_service(
        model_dir=model_dir,
        manifest=manifest,
        model_name="m",
        gpu_id=None,
        batch_size=batch_size,
        **{"model_yaml_config": {}, **kwargs},
    )


def req(
    body: bytes,
    content_type: str | None = None,
    request_id: str = "r",
    name: str = "body",
    headers: dict[str, str] | None = None,
) -> Request:
    return Request(request_id=request_id, headers=headers or {}, inputs=[InputParam(name, content_type, body)])


def error(response: Response) -> dict[str, Any]:
    assert response.content_type == "application/json"
    payload = json.loads(response.body)
    assert payload["code"] == response.status
    return payload


ECHO = """
    def handle(data, context):
        if data is None:
            return None
        return [row.get("body") for row in data]
"""


def test_module_level_handle_is_initialised_with_none_and_echoes(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        STATE = {}
        def handle(data, context):
            if data is None:
                STATE["init"] = context.system_properties
                return None
            return [bytes(row["body"]).upper() for row in data]
    """,
    )
    assert sys.modules["handler"].STATE["init"]["server_name"] == "MMS"
    assert sys.modules["handler"].STATE["init"]["batch_size"] == 4
    out = service.predict([req(b"abc", request_id="a"), req(b"xyz", request_id="b")])
    assert [(r.status, r.body, r.content_type) for r in out] == [(200, b"ABC", None), (200, b"XYZ", None)]


@pytest.mark.parametrize("handler", ["handler.py", "handler", "handler:handle", "sub/handler.py"])
def test_handler_string_forms(tmp_path: Path, handler: str) -> None:
    service = make_service(tmp_path, ECHO, handler=handler)
    assert service.predict([req(b"x")])[0].body == b"x"


def test_module_colon_function_picks_that_function(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        def handle(data, context):
            return ["wrong"] * len(data or [])
        def custom(data, context):
            return None if data is None else ["right"] * len(data)
    """,
        handler="handler:custom",
    )
    assert service.predict([req(b"x")])[0].body == b"right"


def test_class_entry_point_with_initialize(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        class Echo:
            def initialize(self, context):
                self.prefix = context.model_name.encode()
            def handle(self, data, context):
                return [self.prefix + b":" + bytes(row["body"]) for row in data]
    """,
    )
    assert service.predict([req(b"x")])[0].body == b"m:x"


@pytest.mark.parametrize(
    ("source", "handler", "expected"),
    [
        ("raise ImportError('needs the frobnicator package')\n", "handler.py", "needs the frobnicator package"),
        ("class A:\n    pass\nclass B:\n    pass\n", "handler.py", "found classes: A, B"),
        ("class A:\n    def handle(self, d, c):\n        pass\n", "handler.py", "has no initialize"),
        (ECHO, "handler:nope", "has no function 'nope'"),
        (ECHO, "no_such_module", "Unable to load module"),
        ("def handle(data, context):\n    raise ValueError('bad weights file')\n", "handler.py", "bad weights file"),
    ],
)
def test_load_failures_raise_handler_error(tmp_path: Path, source: str, handler: str, expected: str) -> None:
    with pytest.raises(HandlerError, match=expected) as info:
        make_service(tmp_path, source, handler=handler)
    if "raise" in source:
        assert "handler.py" in str(info.value)  # the traceback summary points into the handler


@pytest.mark.parametrize(
    "source",
    [
        ECHO,
        "class Echo:\n    def initialize(self, context):\n        pass\n    def handle(self, data, context):\n"
        "        return [row.get('body') for row in data]\n",
    ],
    ids=["function", "class-of-its-own"],
)
def test_a_variant_that_the_handler_would_not_apply_is_a_load_error(tmp_path: Path, source: str) -> None:
    with pytest.raises(HandlerError, match=r"optimization='bf16', but handler 'handler.py' does not apply it"):
        make_service(tmp_path, source, model_yaml_config={"optimization": "bf16"})
    # eager is the model as loaded: nothing to apply
    assert (
        make_service(tmp_path, source, model_yaml_config={"optimization": "eager"}).predict([req(b"x")])[0].status
        == 200
    )


def test_manifest_without_handler(tmp_path: Path) -> None:
    with pytest.raises(HandlerError, match="names no handler"):
        load_service(
            model_dir=tmp_path, manifest={"model": {}}, model_name="m", gpu_id=None, batch_size=1, model_yaml_config={}
        )


def test_same_module_name_in_two_model_dirs_loads_each_its_own(tmp_path: Path) -> None:
    first = make_service(tmp_path / "a", 'def handle(data, context):\n    return ["a"] * len(data or [])\n')
    second = make_service(tmp_path / "b", 'def handle(data, context):\n    return ["b"] * len(data or [])\n')
    assert first.predict([req(b"")])[0].body == b"a"
    assert second.predict([req(b"")])[0].body == b"b"


DESCRIBE_TYPES = """
    def handle(data, context):
        if data is None:
            return None
        out = []
        for row in data:
            value = next(iter(row.values()))
            out.append({"type": type(value).__name__, "value": value if isinstance(value, (str, dict, list)) else None})
        return out
"""


def test_inputs_decoded_as_torchserve(tmp_path: Path) -> None:
    service = make_service(tmp_path, DESCRIBE_TYPES)
    out = service.predict(
        [
            req(b'{"a": [1, 2]}', "application/json; charset=utf-8"),
            req("héllo".encode(), "text/plain"),
            req(b"\x89PNG...", "image/png"),
            req(b"raw", None),
            req(b"\xff\xfe", "text/plain"),
        ]
    )
    decoded = [json.loads(r.body) for r in out]
    assert decoded == [
        {"type": "dict", "value": {"a": [1, 2]}},
        {"type": "str", "value": "héllo"},
        {"type": "bytearray", "value": None},
        {"type": "bytearray", "value": None},
        {"type": "bytearray", "value": None},  # undecodable text is passed on as bytes, like TorchServe
    ]
    assert all(r.status == 200 and r.content_type == "application/json" for r in out)


def test_decode_input_request_false_passes_bytes(tmp_path: Path) -> None:
    service = make_service(tmp_path, DESCRIBE_TYPES, decode_input_request=False)
    assert json.loads(service.predict([req(b"[1]", "application/json")])[0].body)["type"] == "bytearray"


def test_invalid_json_fails_only_its_request(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        SEEN = []
        def handle(data, context):
            if data is None:
                return None
            SEEN.append(len(data))
            return [row["body"]["n"] * 2 for row in data]
    """,
    )
    out = service.predict(
        [
            req(b'{"n": 1}', "application/json", "a"),
            req(b"{oops", "application/json", "b"),
            req(b'{"n": 5}', "application/json", "c"),
        ]
    )
    assert [r.status for r in out] == [200, 400, 200]
    assert [out[0].body, out[2].body] == [b"2", b"10"]
    payload = error(out[1])
    assert payload["type"] == "BadRequestException"
    assert payload["message"].startswith("request b: body is not valid JSON")
    assert sys.modules["handler"].SEEN == [2]


def test_outputs_encoded_as_torchserve(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        import torch
        def handle(data, context):
            if data is None:
                return None
            context.set_response_status(201, "Made", 0)
            context.set_response_content_type(1, "text/csv")
            context.set_response_header(2, "X-Kind", "tensor")
            return [b"\\x00raw", "tëxt", torch.arange(3), {"k": [1, 2]}]
    """,
    )
    out = service.predict([req(b"", request_id=str(i)) for i in range(4)])
    assert (out[0].status, out[0].reason, out[0].body, out[0].content_type) == (201, "Made", b"\x00raw", None)
    assert (out[1].status, out[1].body, out[1].content_type) == (200, "tëxt".encode(), "text/csv")
    assert out[1].headers == {}
    assert torch.equal(torch.load(io.BytesIO(out[2].body), weights_only=True), torch.arange(3))
    assert out[2].headers == {"X-Kind": "tensor"}
    assert out[3].body == json.dumps({"k": [1, 2]}, indent=2).encode()
    assert out[3].content_type == "application/json"


def test_unserializable_output_fails_only_that_item(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        def handle(data, context):
            return None if data is None else ["fine", object()]
    """,
    )
    out = service.predict([req(b""), req(b"")])
    assert out[0].status == 200
    assert (out[1].status, error(out[1])["message"]) == (503, "Unsupported model output data type.")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return None if data is None else {'not': 'a list'}", "Invalid model predict output"),
        ("return None if data is None else ['only one']", "number of batch response mismatched"),
    ],
)
def test_wrong_return_fails_whole_batch_with_503(tmp_path: Path, body: str, message: str) -> None:
    service = make_service(tmp_path, f"def handle(data, context):\n    {body}\n")
    out = service.predict([req(b"1"), req(b"2"), req(b"3")])
    assert [r.status for r in out] == [503, 503, 503]
    assert {error(r)["message"] for r in out} == {message}
    assert error(out[0])["type"] == "InternalServerException"


def test_one_failing_request_does_not_fail_its_batch(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        CALLS = []
        def handle(data, context):
            if data is None:
                return None
            CALLS.append([context.get_request_id(i) for i in range(len(data))])
            if any(bytes(row["body"]) == b"boom" for row in data):
                raise ValueError("boom")
            return [bytes(row["body"]) for row in data]
    """,
    )
    out = service.predict([req(b"ok1", request_id="a"), req(b"boom", request_id="b"), req(b"ok2", request_id="c")])
    assert [r.status for r in out] == [200, 503, 200]
    assert [out[0].body, out[2].body] == [b"ok1", b"ok2"]
    assert error(out[1]) == {"code": 503, "type": "InternalServerException", "message": "Prediction failed"}
    assert sys.modules["handler"].CALLS == [["a", "b", "c"], ["a"], ["b"], ["c"]]


def test_prediction_exception_sets_custom_code(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        from servetune.handlers.util import PredictionException
        def handle(data, context):
            if data is None:
                return None
            if bytes(data[0]["body"]) == b"teapot":
                raise PredictionException("I am a teapot", 418)
            return ["ok"] * len(data)
    """,
    )
    out = service.predict([req(b"teapot"), req(b"tea")])
    assert [r.status for r in out] == [418, 200]
    assert error(out[0]) == {"code": 418, "type": "InternalServerException", "message": "I am a teapot"}


@pytest.mark.parametrize(
    ("raise_stmt", "status", "message"),
    [
        ("raise MemoryError()", 507, "Out of resources"),
        ("raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')", 507, "Out of resources"),
        ("raise KeyError('x')", 503, "Prediction failed"),
    ],
)
def test_exception_mapping(tmp_path: Path, raise_stmt: str, status: int, message: str) -> None:
    service = make_service(tmp_path, f"def handle(data, context):\n    if data is not None:\n        {raise_stmt}\n")
    (out,) = service.predict([req(b"")])
    assert (out.status, error(out)["message"]) == (status, message)


def test_context_carries_request_headers_and_input_content_types(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        def handle(data, context):
            if data is None:
                return None
            return [{"all": context.get_all_request_header(i), "upper": context.get_request_header(i, "X-TOKEN"),
                     "id": context.get_request_id(i), "seq": context.get_sequence_id(i)} for i in range(len(data))]
    """,
    )
    request = Request(
        "id-1",
        {"x-token": "t", "ts_request_sequence_id": "s1"},
        [InputParam("data", "image/png", b"."), InputParam("mode", None, b"fast")],
    )
    (out,) = service.predict([request])
    assert json.loads(out.body) == {
        "all": {
            "data": {"content-type": "image/png"},
            "mode": {"content-type": None},
            "x-token": "t",
            "ts_request_sequence_id": "s1",
            "explain": "False",  # set by the worker from the request's control, as for every request
        },
        "upper": "t",
        "id": "id-1",
        "seq": "s1",
    }


def test_statuses_set_in_a_batch_do_not_leak_into_the_next(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        def handle(data, context):
            if data is None:
                return None
            if bytes(data[0]["body"]) == b"accepted":
                context.set_all_response_status(202, "Accepted")
            return ["x"] * len(data)
    """,
    )
    assert [r.status for r in service.predict([req(b"accepted"), req(b"")])] == [202, 202]
    assert [r.status for r in service.predict([req(b"plain")])] == [200]


def test_prediction_time_metric_recorded(tmp_path: Path) -> None:
    service = make_service(tmp_path, ECHO)
    service.predict([req(b"x")])
    service.predict([req(b"y")])
    from servetune.handlers.metrics import MetricTypes

    metric = service.context.metrics.get_metric("PredictionTime", MetricTypes.GAUGE)
    assert metric.unit == "ms" and len(metric.samples) == 2
    assert all(s.value >= 0 for s in metric.samples)


def test_response_headers_keep_strings_only(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        def handle(data, context):
            if data is None:
                return None
            context.set_response_header(0, "X-Count", 3)
            context.set_response_header(0, "Content-Type", "text/x-custom")
            return ["x"]
    """,
    )
    (out,) = service.predict([req(b"")])
    assert (out.headers, out.content_type) == ({"X-Count": "3"}, "text/x-custom")


def test_deeply_nested_json_is_a_bad_request_not_a_crash(tmp_path: Path) -> None:
    service = make_service(tmp_path, ECHO)
    deep = b"[" * 100_000 + b"]" * 100_000
    out = service.predict([req(deep, "application/json"), req(b"fine")])
    assert [r.status for r in out] == [400, 200]


def test_handler_breaking_the_context_still_gets_answers(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        def handle(data, context):
            if data is None:
                return None
            context.request_processor = None
            return ["x"] * len(data)
    """,
    )
    out = service.predict([req(b""), req(b"")])
    assert [(r.status, error(r)["message"]) for r in out] == [(503, "Prediction failed")] * 2


@pytest.mark.parametrize(
    ("files", "handler", "extra", "reason"),
    [
        ({}, "image_classifier", {}, "the built-in handler image_classifier uses torch"),
        ({"h.py": "import json\n"}, "h.py", {"serializedFile": "w.pt"}, "the manifest names a serializedFile (w.pt)"),
        (
            {"h.py": "def handle(d, c):\n    from ts.torch_handler import base_handler\n"},
            "h.py",
            {},
            "h.py imports ts.torch_handler",  # inside a function: initialize runs in the loading parent
        ),
        (
            {"h.py": "import helper\n", "helper.py": "import transformers.pipelines\n"},
            "h",
            {},
            "helper.py imports transformers.pipelines",
        ),
        ({"h.py": "import json, os\nfrom . import x\n"}, "h.py", {}, None),
        ({"image_classifier.py": "import json\n"}, "image_classifier", {}, None),  # the archive's own, not the built-in
    ],
)
def test_heavy_imports_are_read_from_the_archives_files(
    tmp_path: Path, files: dict[str, str], handler: str, extra: dict[str, str], reason: str | None
) -> None:
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    found = heavy_imports({"model": {"handler": handler, **extra}}, tmp_path)
    assert found == reason


def test_a_batch_is_split_by_control_and_client_control_headers_are_dropped(tmp_path: Path) -> None:
    service = make_service(
        tmp_path,
        """
        servetune_explains = True

        def handle(data, context):
            if data is None:
                return None
            seen = [sorted(k for k in context.get_all_request_header(i) if k in ("explain", "describe")
                           or k.startswith("x-servetune")) for i in range(len(data))]
            return [{"call": len(data), "explain": context.get_request_header(0, "explain"), "seen": seen[i]}
                    for i in range(len(data))]
    """,
    )
    spoofed = {"explain": "True", "describe": "True", "x-servetune-protocol": "oip-metadata"}
    batch = [
        Request("attacker", spoofed, [InputParam("body", None, b"a")], Control(explain=True)),
        Request("victim-1", {}, [InputParam("body", None, b"b")]),
        Request("victim-2", spoofed, [InputParam("body", None, b"c")]),
    ]
    answers = [json.loads(r.body) for r in service.predict(batch)]
    assert answers == [
        {"call": 1, "explain": "True", "seen": ["explain"]},
        {"call": 2, "explain": "False", "seen": ["explain"]},
        {"call": 2, "explain": "False", "seen": ["explain"]},
    ]
