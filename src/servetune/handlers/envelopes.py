"""Request envelopes: how a handler sees a KServe v1 or Open Inference Protocol v2 request, and how its answer is
wrapped back (TorchServe's ``ts/torch_handler/request_envelope``, without its first-request-only bug).

The API layer tells the worker which protocol a request came in by in its typed control
(``servetune.handlers.control``: :data:`KSERVE_V1`, :data:`OIP_V2`, ``TORCHSERVE`` on TorchServe's own routes), never
in a header a client could send. The envelope is chosen per request:

- KServe v1 -> ``kserve``: the handler gets the ``instances`` (or ``inputs``) of the request, answers one item per
  instance, and the request gets ``{"predictions": [...]}`` (``{"explanations": [...]}`` for ``:explain``).
- OIP v2 -> ``kservev2`` (TorchServe's shape, the default for every handler): one item per input tensor,
  ``{"name", "shape", "datatype", "data"}`` with ``data`` nested to the shape (a BYTES tensor of one element: that
  element, as text when it is UTF-8, which is what a raw-bytes handler reads as the body); each returned item becomes
  an output named after the input at its index, flattened. A BYTES tensor of N > 1 elements (a batch dimension) is N
  items, one per element, and its N answers one output of N elements named after it (TorchServe handed over only the
  first element). Or ``tensors`` (servetune's form), when the
  handler (class or module) sets ``servetune_envelope = "tensors"``: one :class:`~servetune.tensors.InferenceRequest`
  per request, answered by an ``InferenceResponse``, a list of ``Tensor``, a ``{name: array}`` dict or one array.
- TorchServe's routes -> the ``service_envelope`` configured (``body``, ``json``, ``kserve``, ``kservev2``), or none.

A batch may mix protocols: each group runs through the handler on its own. Within a group the items of every request
are concatenated, so a batch of N requests is one handler call; the answers are split back by each request's item
count. A batch of one request keeps TorchServe's exact behaviour (any number of answers); in a larger batch the
handler must answer one item per item, or one per request, else every request is run again alone.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from servetune._exceptions import HandlerError
from servetune.handlers.codec import error_body, json_value
from servetune.handlers.context import Context, RequestProcessor
from servetune.handlers.control import KSERVE_V1, OIP_V2
from servetune.handlers.util import BadInputError

if TYPE_CHECKING:
    from servetune.tensors import InferenceRequest, Tensor

# The OIP tensor codec (servetune.tensors, numpy) is imported by the functions that use it, on a worker's first
# v2 request: most of a worker's start-up time is numpy's import, and a handler spoken to over TorchServe's or
# KServe v1's protocol never needs it.

logger = logging.getLogger(__name__)

SERVICE_ENVELOPES = ("body", "json", "kserve", "kservev2")  # TorchServe's ``service_envelope`` values
FORM_ATTRIBUTE = "servetune_envelope"  # on the handler class or module: "tensors" for servetune's form of v2

Handle = Callable[[Any, Context], Any]


class EnvelopeMismatch(HandlerError):
    """The handler's answers cannot be shared out among the batch's requests (the worker runs each alone)."""


class Envelope(Protocol):
    def parse(self, row: dict[str, Any], context: Context, idx: int) -> tuple[list[Any], Any]:
        """The handler's items for one request, and what ``format`` needs later; BadInputError: answered 400."""
        ...

    def format(self, state: Any, answers: list[Any], context: Context, idx: int) -> Any:
        """The request's answer from the handler's answers to its items."""
        ...


def _body(row: dict[str, Any]) -> Any:
    value = row.get("data")
    return value if value else row.get("body", value)


def _json_body(row: dict[str, Any], *, strict: bool = False) -> Any:
    """The row's body as JSON (already decoded by the worker when it came as ``application/json``)."""
    body = _body(row)
    return json_value("body", body, strict=strict) if isinstance(body, (bytes, bytearray)) else body


class BodyEnvelope:
    """``body``: the payload of each request, as is."""

    def parse(self, row: dict[str, Any], context: Context, idx: int) -> tuple[list[Any], Any]:
        return [_body(row)], None

    def format(self, state: Any, answers: list[Any], context: Context, idx: int) -> Any:
        return answers[0] if len(answers) == 1 else answers


class JsonEnvelope:
    """``json`` (TensorFlow Serving's form): ``{"instances": [...]}`` in (``{"b64": ...}`` decoded), a JSON text of
    ``{"predictions": [...]}`` out."""

    def parse(self, row: dict[str, Any], context: Context, idx: int) -> tuple[list[Any], Any]:
        body = _json_body(row)
        rows = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(rows, list):
            raise BadInputError('expected a JSON body {"instances": [...]}')

        def unwrap(value: Any) -> Any:
            return base64.b64decode(value["b64"]) if isinstance(value, dict) and list(value) == ["b64"] else value

        def columns(item: Any) -> Any:
            if isinstance(item, dict) and list(item) != ["b64"]:
                return {k: unwrap(v) for k, v in item.items()}
            return unwrap(item)

        return [columns(item) for item in rows], None

    def format(self, state: Any, answers: list[Any], context: Context, idx: int) -> Any:
        return json.dumps({"predictions": answers})


class KServeEnvelope:
    """``kserve`` (KServe v1): the ``instances`` in, ``{"predictions": [...]}`` (or ``explanations``) out. The one
    place a v1 body is checked (the API hands it over as it came): strict JSON on KServe's route, an object with an
    ``instances`` or ``inputs`` list (400 otherwise)."""

    def parse(self, row: dict[str, Any], context: Context, idx: int) -> tuple[list[Any], Any]:
        body = _json_body(row, strict=context.get_request_control(idx).protocol == KSERVE_V1)
        instances = None
        if isinstance(body, dict):
            instances = body.get("instances", body.get("inputs"))
        if not isinstance(instances, list):
            raise BadInputError('expected a JSON body {"instances": [...]} or {"inputs": [...]}')
        return instances, None

    def format(self, state: Any, answers: list[Any], context: Context, idx: int) -> Any:
        key = "explanations" if context.get_request_control(idx).explain else "predictions"
        return {key: answers}


def oip_request(row: dict[str, Any], context: Context, idx: int) -> InferenceRequest:
    """The OIP request of one row: the API's binary form, or a JSON body on TorchServe's routes."""
    from servetune.tensors import (
        BINARY_PARAMETERS,
        HEADER_LENGTH,
        TensorError,
        TensorLimitError,
        parse_header_length,
        parse_request,
    )

    body = _body(row)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        if not isinstance(body, (bytes, bytearray)):
            raise TensorError("the body is empty")
        header = context.get_request_header(idx, HEADER_LENGTH)
        length = parse_header_length(header if isinstance(header, str) else None)
        request = parse_request(body, length, context.tensor_limits)
    except TensorError as exc:
        raise BadInputError(str(exc), 413 if isinstance(exc, TensorLimitError) else 400) from None
    for tensor in request.inputs:
        tensor.parameters = {k: v for k, v in tensor.parameters.items() if k not in BINARY_PARAMETERS}
    return request


def _handler_parameters(request: InferenceRequest) -> dict[str, Any]:
    from servetune.tensors import BINARY_PARAMETERS

    return {k: v for k, v in request.parameters.items() if k not in BINARY_PARAMETERS}


def oip_answer(request: InferenceRequest, outputs: list[Tensor], context: Context, idx: int, **extra: Any) -> bytes:
    """The REST body of a v2 answer (the outputs the request asks for, in the form it asks for); sets the request's
    content type and ``Inference-Header-Content-Length``."""
    from servetune.tensors import HEADER_LENGTH, InferenceResponse, TensorError, encode_response

    info = (context.manifest or {}).get("model") or {}
    response = InferenceResponse(
        model_name=extra.get("model_name") or context.model_name,
        outputs=outputs,
        model_version=extra.get("model_version") or str(info.get("modelVersion") or "1.0"),
        id=request.id if request.id and request.id.strip() else context.get_request_id(idx),
        parameters=dict(extra.get("parameters") or {}),
    )
    try:
        body, header_length = encode_response(response, request)
    except TensorError as exc:
        context.set_response_status(400, "Bad Request", idx)
        context.set_response_content_type(idx, "application/json")
        return error_body(400, "BadRequestException", str(exc))
    if header_length is None:
        context.set_response_content_type(idx, "application/json")
    else:
        context.set_response_content_type(idx, "application/octet-stream")
        context.set_response_header(idx, HEADER_LENGTH, str(header_length))
    return body


class KServeV2Envelope:
    """``kservev2`` (TorchServe's shape of OIP v2): one item per input tensor, one output per answer; a BYTES tensor of
    several elements (a batch of images, of texts) is one item per element, answered as one output of its shape."""

    def parse(self, row: dict[str, Any], context: Context, idx: int) -> tuple[list[Any], Any]:
        request = oip_request(row, context, idx)
        items: list[dict[str, Any]] = []
        for tensor in request.inputs:
            extra: dict[str, Any] = {"parameters": dict(tensor.parameters)} if tensor.parameters else {}
            if tensor.datatype == "BYTES" and tensor.data.size > 1:  # a batch dimension: one item per element
                for element in tensor.data.reshape(-1):
                    items.append({"name": tensor.name, "shape": [1], "datatype": "BYTES", "data": _text(element)})
                    items[-1].update(extra)
                continue
            if tensor.datatype == "BYTES":  # TorchServe's: the first (here the only) element, as text when UTF-8
                data: Any = _text(tensor.data.reshape(-1)[0] if tensor.data.size else b"")
            else:
                data = tensor.data.tolist()
            items.append({"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype, "data": data})
            items[-1].update(extra)
        return items, request

    def format(self, state: Any, answers: list[Any], context: Context, idx: int) -> Any:
        request: InferenceRequest = state
        names = [t.name for t in request.inputs]
        counts = [t.data.size if t.datatype == "BYTES" and t.data.size > 1 else 1 for t in request.inputs]
        if max(counts, default=1) == 1:  # TorchServe's shape: answer i is output i, flattened
            named = [(names[i] if i < len(names) else f"output-{i}", answer) for i, answer in enumerate(answers)]
            return oip_answer(request, [_output(name, answer, flat=True) for name, answer in named], context, idx)
        if len(answers) != sum(counts):
            raise BadInputError(
                f"the handler answered {len(answers)} items for the {sum(counts)} elements of the request's inputs", 500
            )
        outputs, pos = [], 0
        for name, count in zip(names, counts, strict=True):
            chunk = answers[pos : pos + count]
            pos += count
            outputs.append(_output(name, chunk[0], flat=True) if count == 1 else _output(name, chunk, flat=False))
        return oip_answer(request, outputs, context, idx)


def _text(element: bytes) -> str | bytes:
    """A BYTES element as the ``kservev2`` envelope hands it over: text when it is UTF-8, else the bytes."""
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError:
        return element


def _output(name: str, answer: Any, *, flat: bool) -> Tensor:
    """An answer as output ``name``: flattened (one answer), or in its own shape (the answers to the elements of a
    BYTES input: a list, one per element)."""
    from servetune.tensors import Tensor, TensorError

    try:
        tensor = Tensor.from_array(name, _texts(answer))
    except TensorError as exc:
        raise BadInputError(f"the handler's answer cannot be an OIP tensor: {exc}", 500) from None
    return Tensor(name, tensor.datatype, (tensor.data.size,), tensor.data.reshape(-1)) if flat else tensor


class TensorsEnvelope:
    """``tensors`` (servetune's form of OIP v2): one ``InferenceRequest`` per request, one answer per request."""

    def parse(self, row: dict[str, Any], context: Context, idx: int) -> tuple[list[Any], Any]:
        from servetune.tensors import InferenceRequest

        request = oip_request(row, context, idx)
        handed = InferenceRequest(request.inputs, request.id, _handler_parameters(request), request.outputs)
        return [handed], request

    def format(self, state: Any, answers: list[Any], context: Context, idx: int) -> Any:
        from servetune.tensors import InferenceResponse, Tensor, TensorError

        request: InferenceRequest = state
        answer = answers[0] if len(answers) == 1 else answers
        extra: dict[str, Any] = {}
        try:
            if isinstance(answer, InferenceResponse):
                extra = {"model_name": answer.model_name, "model_version": answer.model_version}
                extra["parameters"] = answer.parameters
                outputs = list(answer.outputs)
            elif isinstance(answer, Tensor):
                outputs = [answer]
            elif isinstance(answer, list) and all(isinstance(t, Tensor) for t in answer):
                outputs = list(answer)
            elif isinstance(answer, Mapping):
                outputs = [
                    Tensor(str(k), v.datatype, v.shape, v.data, v.parameters)
                    if isinstance(v, Tensor)
                    else Tensor.from_array(str(k), v)
                    for k, v in answer.items()
                ]
            else:
                outputs = [Tensor.from_array("output-0", answer)]
        except TensorError as exc:
            raise BadInputError(f"the handler's answer cannot be an OIP tensor: {exc}", 500) from None
        return oip_answer(request, outputs, context, idx, **extra)


def _texts(value: Any) -> Any:
    """An answer as an array; objects in it (a dict a handler returned) become their JSON text, a valid BYTES
    element (TorchServe put the object itself in ``data``)."""
    import numpy as np

    if not isinstance(value, (list, tuple, dict, str, bytes)):
        return value  # an array, a tensor, a number
    try:
        array = np.asarray(value)
    except ValueError:  # ragged
        array = np.empty(len(value), dtype=object)
        array[:] = list(value)
    if array.dtype != object:
        return array
    flat = [v if isinstance(v, (str, bytes)) else json.dumps(v) for v in array.reshape(-1)]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


ENVELOPES: dict[str, Callable[[], Envelope]] = {
    "body": BodyEnvelope,
    "json": JsonEnvelope,
    "kserve": KServeEnvelope,
    "kservev2": KServeV2Envelope,
    "tensors": TensorsEnvelope,
}


@dataclass(frozen=True)
class _Group:
    envelope: str
    indices: list[int]


class Envelopes:
    """The handler's entry point, wrapped: each request through the envelope of its protocol (see the module)."""

    def __init__(self, handle: Handle, owner: Any, service_envelope: str | None = None) -> None:
        if service_envelope is not None and service_envelope not in SERVICE_ENVELOPES:
            raise ValueError(f"service_envelope={service_envelope!r}: expected one of {', '.join(SERVICE_ENVELOPES)}")
        self.handle = handle
        self.owner = owner
        form = getattr(owner, FORM_ATTRIBUTE, None)
        self.v2 = "tensors" if form == "tensors" else "kservev2"
        self.default = self.v2 if service_envelope == "kservev2" else service_envelope

    def __call__(self, data: Any, context: Context) -> Any:
        if not data or not isinstance(data, list) or context.request_processor is None:
            return self.handle(data, context)
        groups = self._groups(len(data), context)
        if groups is None:
            return self.handle(data, context)
        answers: list[Any] = [None] * len(data)
        processors, ids = context.request_processor, context.request_ids or {}
        try:
            for group in groups:
                rows = [data[i] for i in group.indices]
                context.request_processor = [processors[i] for i in group.indices]
                context.request_ids = {j: ids.get(i, "") for j, i in enumerate(group.indices)}
                for i, answer in zip(group.indices, self._run(group.envelope, rows, context), strict=True):
                    answers[i] = answer
        finally:
            context.request_processor, context.request_ids = processors, ids
        return answers

    def _groups(self, size: int, context: Context) -> list[_Group] | None:
        """Requests by envelope, in order of first appearance; None: no request needs one."""
        keys: dict[str, list[int]] = {}
        for i in range(size):
            control = context.get_request_control(i)
            if control.describe:
                return None
            protocol = control.protocol
            key = {KSERVE_V1: "kserve", OIP_V2: self.v2}.get(protocol, self.default)
            keys.setdefault(key or "", []).append(i)
        if list(keys) == [""]:
            return None
        if "" in keys:
            keys["body-raw"] = keys.pop("")
        return [_Group(k, v) for k, v in keys.items()]

    def _run(self, name: str, rows: list[Any], context: Context) -> list[Any]:
        """One envelope over the requests of ``rows`` (the context holds just these requests)."""
        if name == "body-raw":
            answers = self.handle(rows, context)
            if not isinstance(answers, list) or len(answers) != len(rows):
                raise EnvelopeMismatch("the handler did not answer one item per request")
            return answers
        envelope = ENVELOPES[name]()
        processors, ids = context.request_processor or [], context.request_ids or {}
        results: list[Any] = [None] * len(rows)
        parsed: list[tuple[int, list[Any], Any]] = []
        for idx, row in enumerate(rows):
            try:
                items, state = envelope.parse(row if isinstance(row, dict) else {"body": row}, context, idx)
            except BadInputError as exc:
                results[idx] = _reject(processors[idx], ids.get(idx), exc)
                continue
            if items:
                parsed.append((idx, items, state))
            else:  # nothing for the handler (``{"instances": []}``): an empty answer, without calling it
                results[idx] = self._format(envelope, state, [], context, idx)
        if not parsed:
            return results
        items = [item for _, its, _ in parsed for item in its]
        owners = [idx for idx, its, _ in parsed for _ in its]
        context.request_processor = [processors[idx] for idx in owners]
        context.request_ids = {j: ids.get(idx, "") for j, idx in enumerate(owners)}
        try:
            answers = self.handle(items, context)
        finally:
            context.request_processor, context.request_ids = processors, ids
        for (idx, _, state), chunk in zip(parsed, self._share(answers, parsed), strict=True):
            processor = processors[idx]
            if processor.get_response_status_code() >= 400:  # the handler rejected one of its items
                results[idx] = next((a for a in chunk if isinstance(a, (bytes, bytearray))), chunk[0] if chunk else b"")
                continue
            results[idx] = self._format(envelope, state, chunk, context, idx)
        return results

    @staticmethod
    def _format(envelope: Envelope, state: Any, chunk: list[Any], context: Context, idx: int) -> Any:
        try:
            return envelope.format(state, chunk, context, idx)
        except BadInputError as exc:
            processors = context.request_processor or []
            return _reject(processors[idx], (context.request_ids or {}).get(idx), exc)

    @staticmethod
    def _share(answers: Any, parsed: list[tuple[int, list[Any], Any]]) -> list[list[Any]]:
        if not isinstance(answers, list):
            raise EnvelopeMismatch(f"the handler answered a {type(answers).__name__}, not a list")
        if len(parsed) == 1:
            return [answers]  # TorchServe's envelope: whatever the one request's handler call answered
        counts = [len(items) for _, items, _ in parsed]
        if len(answers) == sum(counts):
            chunks, pos = [], 0
            for count in counts:
                chunks.append(answers[pos : pos + count])
                pos += count
            return chunks
        if len(answers) == len(parsed):
            return [[answer] for answer in answers]
        raise EnvelopeMismatch(
            f"the handler answered {len(answers)} items for {sum(counts)} items of {len(parsed)} requests"
        )


def _reject(processor: RequestProcessor, request_id: str | None, exc: BadInputError) -> bytes:
    code = exc.error_code if isinstance(exc.error_code, int) and 400 <= exc.error_code <= 599 else 400
    processor.report_status(code, HTTPStatus(code).phrase if code in _STATUSES else "Error")
    processor.add_response_property("content-type", "application/json")
    message = f"request {request_id}: {exc.message}" if request_id else exc.message
    kind = "RequestEntityTooLargeException" if code == 413 else exc.error_type
    return error_body(code, kind if code < 500 else "InternalServerException", message)


_STATUSES = frozenset(s.value for s in HTTPStatus)


def handler_metadata(owner: Any) -> dict[str, Any] | None:
    """The handler's own OIP metadata (``model_metadata()`` on its class or module): a mapping that JSON can carry
    (the worker reports it once, when loaded), or None."""
    method = getattr(owner, "model_metadata", None)
    if not callable(method):
        return None
    try:
        value = method()
        json.dumps(value)
    except Exception:  # noqa: BLE001 - metadata is optional: a failing method (or an answer JSON cannot carry) means none
        logger.warning("model_metadata() failed", exc_info=True)
        return None
    return value if isinstance(value, dict) else None


def with_envelopes(handle: Handle, module: ModuleType, service_envelope: str | None = None) -> Envelopes:
    """Wrap a handler's entry point (``handle`` of its instance, or the module's function)."""
    return Envelopes(handle, getattr(handle, "__self__", module), service_envelope)


__all__ = [
    "ENVELOPES",
    "KSERVE_V1",
    "OIP_V2",
    "SERVICE_ENVELOPES",
    "Envelopes",
    "handler_metadata",
    "oip_request",
    "with_envelopes",
]
