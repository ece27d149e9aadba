"""Open Inference Protocol tensors on gRPC: ``InferTensorContents`` and raw contents <-> numpy arrays, with the
checks that make a malformed tensor the caller's error (INVALID_ARGUMENT naming the tensor), never a crash.

Raw contents: the elements row-major, little-endian, no padding; a BYTES element is a 4-byte little-endian length
then its bytes. FP16 and BF16 travel only raw (BF16 is widened to float32 for the handler).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from servetune._exceptions import ApiError
from servetune.protos import CONTENTS_FIELDS

_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to float32 for the handler
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
# datatype -> (numpy dtype, the InferTensorContents field; None: raw only)
DATATYPES: dict[str, tuple[Any, str | None]] = {k: (_NUMPY[k], field) for k, field in CONTENTS_FIELDS.items()}
CONTENT_FIELDS = tuple(sorted({f for _, f in DATATYPES.values() if f}))


@dataclass(frozen=True)
class Tensor:
    """One tensor: ``data`` is a numpy array of ``shape`` (BYTES: an object array of ``bytes``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any


def _invalid(message: str) -> ApiError:
    return ApiError.bad_request(message)


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise _invalid(f"input {name!r}: shape {list(dims)} has a negative dimension")
    return dims


def _dtype(name: str, datatype: str) -> Any:
    if datatype not in DATATYPES:
        raise _invalid(f"input {name!r}: unknown datatype {datatype!r} (expected one of {', '.join(DATATYPES)})")
    return DATATYPES[datatype][0]


def from_contents(name: str, datatype: str, shape: Any, contents: Any) -> Tensor:
    """A tensor from typed contents; its element count must match the shape, in its datatype's field only."""
    dims = _shape(name, shape)
    dtype = _dtype(name, datatype)
    field = DATATYPES[datatype][1]
    if field is None:
        raise _invalid(f"input {name!r}: {datatype} must be sent in raw_input_contents")
    others = [f for f in CONTENT_FIELDS if f != field and len(getattr(contents, f))]
    if others:
        raise _invalid(f"input {name!r}: datatype {datatype} takes {field}, got {', '.join(others)}")
    values = getattr(contents, field)
    count = math.prod(dims)
    if len(values) != count:
        raise _invalid(f"input {name!r}: shape {list(dims)} needs {count} elements, {field} has {len(values)}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = [bytes(v) for v in values]
    else:
        try:
            array = np.asarray(values, dtype=dtype)
        except OverflowError:
            raise _invalid(f"input {name!r}: a value does not fit {datatype}") from None
    return Tensor(name, datatype, dims, array.reshape(dims))


def from_raw(name: str, datatype: str, shape: Any, raw: bytes) -> Tensor:
    """A tensor from its raw contents; the byte count must be what the shape and datatype need."""
    dims = _shape(name, shape)
    dtype = _dtype(name, datatype)
    count = math.prod(dims)
    if datatype == "BYTES":
        items = split_bytes(name, raw)
        if len(items) != count:
            raise _invalid(f"input {name!r}: shape {list(dims)} needs {count} elements, raw contents hold {len(items)}")
        array = np.empty(count, dtype=object)
        array[:] = items
        return Tensor(name, datatype, dims, array.reshape(dims))
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise _invalid(
            f"input {name!r}: shape {list(dims)} of {datatype} needs {expected} bytes, raw contents hold {len(raw)}"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if datatype == "BF16":
        array = (array.astype("<u4") << 16).view("<f4")
    return Tensor(name, datatype, dims, array.reshape(dims))


def split_bytes(name: str, raw: bytes) -> list[bytes]:
    """BYTES elements out of raw contents (each a 4-byte little-endian length and its bytes)."""
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise _invalid(f"input {name!r}: raw BYTES contents end inside an element's length")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise _invalid(f"input {name!r}: a raw BYTES element of {size} bytes runs past the contents")
        items.append(raw[offset : offset + size])
        offset += size
    return items


def join_bytes(items: Any) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in (_as_bytes(x) for x in items))


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


def datatype_of(array: Any) -> str:
    """The OIP datatype of a numpy array (strings and objects: BYTES)."""
    kind = np.asarray(array).dtype
    for datatype, (dtype, _) in DATATYPES.items():
        if datatype not in ("BF16", "BYTES") and dtype == kind.newbyteorder("<"):
            return datatype
    return "BYTES"


def to_array(name: str, datatype: str, shape: Any, data: Any) -> Any:
    """An output's ``data`` (nested or flat, as JSON gives it) as an array of ``shape``, in ``datatype``."""
    dims = tuple(int(d) for d in shape)
    dtype = DATATYPES[datatype][0] if datatype in DATATYPES else None
    if dtype is None:
        raise ApiError.internal(f"output {name!r}: unknown datatype {datatype!r}")
    if datatype == "BYTES":
        flat = np.asarray(data, dtype=object).reshape(-1)
        array = np.empty(flat.size, dtype=object)
        array[:] = [_as_bytes(x) for x in flat]
    else:
        array = np.asarray(data, dtype=np.float32 if datatype == "BF16" else dtype).reshape(-1)
    if array.size != math.prod(dims):
        raise ApiError.internal(f"output {name!r}: shape {list(dims)} does not hold its {array.size} elements")
    return array.reshape(dims)


def to_raw(datatype: str, array: Any) -> bytes:
    if datatype == "BYTES":
        return join_bytes(np.asarray(array, dtype=object).reshape(-1))
    if datatype == "BF16":
        return (np.asarray(array, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype][0]).tobytes()


def fill_contents(contents: Any, datatype: str, array: Any) -> None:
    """Typed contents of an output (FP16 and BF16 have none: the caller sends those raw)."""
    field = DATATYPES[datatype][1]
    if field is None:
        raise ApiError.internal(f"{datatype} outputs travel only raw")
    flat = np.asarray(array).reshape(-1)
    if datatype == "BYTES":
        getattr(contents, field).extend(_as_bytes(x) for x in flat)
    else:
        getattr(contents, field).extend(flat.tolist())


__all__ = [
    "DATATYPES",
    "Tensor",
    "datatype_of",
    "fill_contents",
    "from_contents",
    "from_raw",
    "join_bytes",
    "split_bytes",
    "to_array",
    "to_raw",
]
