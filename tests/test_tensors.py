"""The Open Inference Protocol tensor codec (servetune.tensors): every datatype both ways, JSON and binary, and every
malformed request refused with a TensorError that names what is wrong."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from servetune.tensors import (
    DATATYPES,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    TensorError,
    TensorMetadata,
    datatype_of,
    decode_binary_data,
    encode_request,
    encode_response,
    numpy_dtype,
    parse_header_length,
    parse_request,
    parse_response,
)

NUMERIC = [d for d in DATATYPES if d not in ("BYTES", "BF16")]


def sample(datatype: str) -> np.ndarray:
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        return np.array([[b"a", b"", "é".encode()], [b"\x00\xff", b"xyz", b"q"]], dtype=object)
    dtype = numpy_dtype(datatype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, 0, 1], [2, info.max - 1, info.max]], dtype=dtype)
    return np.array([[-1.5, 0.0, 0.25], [2.0, 1e3, -7.0]], dtype=dtype)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BF16"])
@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_round_trips_through_a_request(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    if datatype == "BYTES" and not binary:
        array = np.array([["a", "", "é"], ["z", "xyz", "q"]], dtype=object)
    request = InferenceRequest([Tensor.from_array("x", array, datatype)], id="r1", parameters={"p": 1})
    body, header_length = encode_request(request, binary=binary)
    assert (header_length is not None) is binary
    back = parse_request(body, header_length)
    tensor = back.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 3))
    expected = Tensor.from_array("x", array, datatype).data
    assert tensor.data.dtype == expected.dtype and tensor.data.tolist() == expected.tolist()
    assert back.id == "r1" and back.parameters == {"p": 1}


def test_bf16_is_two_bytes_on_the_wire_rounded_to_nearest_even() -> None:
    tensor = Tensor.from_array("b", np.array([1.0, 3.14159, -2.5], dtype=np.float32), "BF16")
    raw = tensor.to_bytes()
    assert len(raw) == 6
    assert decode_binary_data("b", "BF16", [3], raw).data.tolist() == [1.0, 3.140625, -2.5]


def test_nested_and_flat_json_data_both_fill_the_shape() -> None:
    for data in ([[1, 2, 3], [4, 5, 6]], [1, 2, 3, 4, 5, 6], [[[1, 2, 3, 4, 5, 6]]]):
        body = json.dumps({"inputs": [{"name": "a", "shape": [2, 3], "datatype": "INT32", "data": data}]})
        assert parse_request(body.encode()).inputs[0].data.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_one_minus_one_in_a_request_shape_is_inferred_as_torchserves_samples_need() -> None:
    body = {"inputs": [{"name": "a", "shape": [-1], "datatype": "BYTES", "data": ["aGk="]}]}
    assert parse_request(json.dumps(body).encode()).inputs[0].shape == (1,)
    body = {"inputs": [{"name": "a", "shape": [-1, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    assert parse_request(json.dumps(body).encode()).inputs[0].shape == (2, 2)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ({"name": "a", "shape": [3], "datatype": "FP32", "data": [1, 2]}, "holds 3 elements but the data has 2"),
        ({"name": "a", "shape": [2], "datatype": "INT32", "data": [1.5, 2]}, "floats, not INT32"),
        ({"name": "a", "shape": [2], "datatype": "UINT8", "data": [1, 256]}, "outside UINT8's range"),
        ({"name": "a", "shape": [2], "datatype": "INT8", "data": [-129, 0]}, "outside INT8's range"),
        ({"name": "a", "shape": [2], "datatype": "BOOL", "data": [1, 0]}, "integers, not BOOL"),
        ({"name": "a", "shape": [2], "datatype": "FP32", "data": ["1", "2"]}, "strings, not FP32"),
        ({"name": "a", "shape": [2], "datatype": "FP32", "data": [[1], [2, 3]]}, "not a rectangular array"),
        ({"name": "a", "shape": [1], "datatype": "BYTES", "data": [1]}, "BYTES data: expected strings"),
        ({"name": "a", "shape": [2], "datatype": "FP8", "data": [1, 2]}, "datatype='FP8'"),
        ({"name": "a", "shape": "2", "datatype": "FP32", "data": [1, 2]}, "shape='2'"),
        ({"name": "a", "shape": [-1, -1], "datatype": "FP32", "data": [1, 2]}, "more than one -1"),
        ({"name": "a", "shape": [2], "datatype": "FP32", "data": 3}, "data: expected a list"),
        ({"name": "", "shape": [1], "datatype": "FP32", "data": [1]}, "name: expected a non-empty string"),
        ({"name": "a", "shape": [1], "datatype": "FP32"}, "no data and no binary_data_size"),
    ],
)
def test_invalid_json_tensors_are_refused_by_name(tensor: dict, message: str) -> None:
    with pytest.raises(TensorError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_request(json.dumps({"inputs": [tensor]}).encode())


def test_invalid_requests_are_refused() -> None:
    cases = {
        b"not json": "not valid JSON",
        b"[1]": "must be a JSON object",
        b"{}": "inputs: expected a non-empty list",
        b'{"inputs": [], "id": 1}': "inputs",
        b'{"inputs": [{"name":"a","shape":[1],"datatype":"FP32","data":[1]}], "id": 5}': "id: expected a string",
        b'{"inputs": [{"name":"a","shape":[1],"datatype":"FP32","data":[1]},'
        b'{"name":"a","shape":[1],"datatype":"FP32","data":[1]}]}': "'a' appears twice",
        b'{"inputs": [{"name":"a","shape":[1],"datatype":"FP32","data":[1]}], "outputs": [{"nom": 1}]}': "outputs",
        b'{"inputs": [{"name":"a","shape":[1],"datatype":"FP32","data":[1]}], "parameters": []}': "parameters",
    }
    for body, message in cases.items():
        with pytest.raises(TensorError, match=message):
            parse_request(body)


def binary_body(size: int, payload: bytes, datatype: str = "FP32", shape: list[int] | None = None) -> bytes:
    header = {
        "inputs": [{"name": "a", "shape": shape or [2], "datatype": datatype, "parameters": {"binary_data_size": size}}]
    }
    return json.dumps(header).encode() + payload


def test_binary_bodies_that_do_not_add_up_are_refused() -> None:
    good = binary_body(8, np.array([1, 2], "<f4").tobytes())
    header_length = good.index(b"}]}") + 3
    assert parse_request(good, header_length).inputs[0].data.tolist() == [1.0, 2.0]
    with pytest.raises(TensorError, match="only 4 bytes of binary data are left"):
        parse_request(good[:-4], header_length)
    with pytest.raises(TensorError, match="binary_data_size adds up to 8"):
        parse_request(good + b"xx", header_length)
    with pytest.raises(TensorError, match="not valid JSON"):
        parse_request(good, header_length - 5)
    with pytest.raises(TensorError, match="not within the body"):
        parse_request(good, len(good) + 1)
    odd = binary_body(6, b"\x00" * 6)
    with pytest.raises(TensorError, match="not a whole number of elements"):
        parse_request(odd, odd.index(b"}]}") + 3)
    truncated = binary_body(7, struct.pack("<I", 9) + b"abc", "BYTES", [1])
    with pytest.raises(TensorError, match="BYTES data is truncated"):
        parse_request(truncated, truncated.index(b"}]}") + 3)
    with pytest.raises(TensorError, match="binary_data_size=-1"):
        body = binary_body(-1, b"")
        parse_request(body, body.index(b"}]}") + 3)


def test_the_header_length_header_must_be_a_number() -> None:
    assert parse_header_length(None) is None and parse_header_length("12") == 12
    for bad in ("", "-1", "twelve", "1.5"):
        with pytest.raises(TensorError, match="Inference-Header-Content-Length"):
            parse_header_length(bad)


def test_binary_data_over_a_bytearray_is_writable_and_not_copied() -> None:
    buffer = bytearray(np.arange(4, dtype="<i4").tobytes())
    tensor = decode_binary_data("a", "INT32", [2, 2], buffer)
    tensor.data[0, 0] = 9
    assert np.frombuffer(buffer, "<i4")[0] == 9


def test_a_response_sends_the_outputs_asked_for_in_the_form_asked_for() -> None:
    outputs = [Tensor.from_array("y", np.array([1.5, 2.5], np.float32)), Tensor.from_array("z", np.array([3]))]
    response = InferenceResponse("m", outputs, "1.0", "id-1")
    body, header_length = encode_response(response)
    assert header_length is None
    assert json.loads(body) == {
        "model_name": "m",
        "model_version": "1.0",
        "id": "id-1",
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]},
            {"name": "z", "datatype": "INT64", "shape": [1], "data": [3]},
        ],
    }
    request = InferenceRequest([], outputs=[RequestedOutput("z", {"binary_data": True})])
    body, header_length = encode_response(response, request)
    assert header_length is not None
    header = json.loads(body[:header_length])
    assert header["outputs"] == [
        {"name": "z", "datatype": "INT64", "shape": [1], "parameters": {"binary_data_size": 8}}
    ]
    assert parse_response(body, header_length).outputs[0].data.tolist() == [3]
    everything = InferenceRequest(
        [],
        parameters={"binary_data_output": True},
        outputs=[RequestedOutput("y", {"binary_data": False}), RequestedOutput("z")],
    )
    body, header_length = encode_response(response, everything)
    parsed = parse_response(body, header_length)
    assert [t.data.tolist() for t in parsed.outputs] == [[1.5, 2.5], [3]]
    assert "data" in json.loads(body[:header_length])["outputs"][0]
    with pytest.raises(TensorError, match="requested, but the model produced"):
        encode_response(response, InferenceRequest([], outputs=[RequestedOutput("nope")]))


def test_a_bytes_output_that_is_not_text_goes_binary_rather_than_failing() -> None:
    response = InferenceResponse("m", [Tensor.from_array("b", np.array([b"\xff\xfe"], dtype=object))])
    body, header_length = encode_response(response)
    assert header_length is not None
    assert parse_response(body, header_length).outputs[0].data.tolist() == [b"\xff\xfe"]


def test_arrays_of_every_kind_get_their_datatype() -> None:
    assert datatype_of(np.dtype("<f2")) == "FP16" and datatype_of(np.dtype(">i8")) == "INT64"
    assert datatype_of(np.dtype("U3")) == "BYTES" and datatype_of(np.dtype(bool)) == "BOOL"
    with pytest.raises(TensorError, match="complex"):
        datatype_of(np.dtype(np.complex64))
    import torch

    assert Tensor.from_array("t", torch.ones(2, dtype=torch.bfloat16)).datatype == "BF16"
    assert Tensor.from_array("t", torch.arange(3)).datatype == "INT64"
    assert Tensor.from_array("s", ["ab", "c"]).data.tolist() == [b"ab", b"c"]
    with pytest.raises(TensorError, match="strings or objects"):
        Tensor.from_array("s", ["ab"], "FP32")


def test_metadata_declarations_are_checked() -> None:
    meta = TensorMetadata.from_json({"name": "x", "datatype": "FP32", "shape": [-1, 3]}, "inputs[0]")
    assert meta.to_json() == {"name": "x", "datatype": "FP32", "shape": [-1, 3]}
    for bad in ({"name": "x", "datatype": "F", "shape": [1]}, {"name": "x", "datatype": "FP32", "shape": [-2]}, [1]):
        with pytest.raises(TensorError, match="inputs"):
            TensorMetadata.from_json(bad, "inputs[0]")


@settings(max_examples=60, deadline=None)
@given(
    datatype=st.sampled_from(NUMERIC),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    binary=st.booleans(),
    data=st.data(),
)
def test_any_numeric_array_survives_both_forms(datatype: str, shape: tuple[int, ...], binary: bool, data) -> None:
    dtype = numpy_dtype(datatype)
    elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False) if dtype.kind == "f" else None
    array = data.draw(hnp.arrays(dtype, shape, elements=elements))
    body, header_length = encode_request(InferenceRequest([Tensor.from_array("x", array)]), binary=binary)
    back = parse_request(body, header_length).inputs[0]
    assert back.shape == shape and back.data.dtype == dtype
    assert np.array_equal(back.data, array)
