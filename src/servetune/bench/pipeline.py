"""A pipeline as one request of the load: the app's calls, one stage after the other, driven as the app drives them.

The built-in engine's closed and open loops (``async_engine.py``) call :meth:`PipelineSender.send` where they would
send one request: the first stage gets the run's input, each later stage a request its hook makes from the previous
answer (``hooks.py``), and the pipeline's latency runs from its (intended) start to its last answer. Each stage call
is recorded too, with the server's queue/handler/batch headers, so a result has per-stage figures beside the end-to-
end ones. A stage that fails (an HTTP error, a timeout, a hook that raises) fails the pipeline with its status; a
hook that returns nothing ends the pipeline there, successfully.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from servetune.bench import hooks as builtin
from servetune.bench.http11 import Http11Pool, encode_request
from servetune.bench.payload import Payload, input_files, multipart
from servetune.bench.recording import CONNECTION, HOOK, TIMEOUT, StageCall
from servetune.bench.sender import Sent
from servetune.bench.spec import BenchSpec, StageSpec
from servetune.timing import read_timing

_NAN = float("nan")
MEMO_SIZE = 512  # hook results remembered, per (input, stage, answer)
_TRIVIAL = (builtin.answer, builtin.same_input)


@dataclass
class _Stage:
    name: str
    url: str
    pool: Http11Pool
    hook: builtin.Hook | None  # None: the first stage, which sends the input
    content_type: str | None
    form_field: str | None


class PipelineSender:
    def __init__(self, spec: BenchSpec, payloads: Sequence[Payload]) -> None:
        self.spec = spec
        self.pools: dict[str, Http11Pool] = {}
        self.stages = [self._stage(spec, i, stage) for i, stage in enumerate(spec.stages)]
        first = self.stages[0]
        self.first = [self._encode(first, p.body, p.content_type) for p in payloads]
        self.sources = [f.read_bytes() for f in input_files(spec.input)] if spec.input is not None else [b""]
        self.memo: OrderedDict[tuple[int, int, bytes], list[bytes] | None] = OrderedDict()
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="servetune-hook")
        self.warnings: list[str] = []

    def _stage(self, spec: BenchSpec, i: int, stage: StageSpec) -> _Stage:
        url = spec.stage_url(stage)
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin not in self.pools:
            self.pools[origin] = Http11Pool(url, spec.max_connections, spec.timeout, keep_body=True)
        hook = None if i == 0 else builtin.load_hook(f"pipeline[{i}].request", stage.request, spec.hook_dir)
        content_type = stage.content_type or (builtin.content_type(hook) if hook else None)
        return _Stage(stage.model, url, self.pools[origin], hook, content_type, stage.form_field)

    def _encode(self, stage: _Stage, body: bytes, content_type: str | None) -> bytes:
        headers = list(self.spec.headers)
        if stage.form_field and stage.hook is not None:
            boundary = hashlib.sha1(body).hexdigest()
            body = multipart(stage.form_field, "part", content_type or "application/octet-stream", body, boundary)
            content_type = f"multipart/form-data; boundary={boundary}"
        if content_type and not any(name.lower() == "content-type" for name, _ in headers):
            headers.append(("Content-Type", content_type))
        return encode_request(self.spec.method.upper(), stage.url, headers, body)

    async def send(self, i: int) -> Sent:
        loop = asyncio.get_running_loop()
        began = loop.time()
        source = i % len(self.first)
        calls: list[StageCall] = []
        queue_total = handler_total = 0.0
        answers: list[bytes] = []
        for index, stage in enumerate(self.stages):
            if stage.hook is None:
                requests = [self.first[source]]
            else:
                made: list[bytes] = []
                for answer in answers:
                    try:
                        bodies = await self._hook(loop, stage, index, source, answer)
                    except Exception as exc:  # the user's hook: one failed pipeline, said once
                        if not self.warnings:
                            self.warnings.append(f"{stage.name}'s hook raised {type(exc).__name__}: {exc}")
                        return HOOK, _NAN, _NAN, 0, tuple(calls)
                    made += [self._encode(stage, body, stage.content_type) for body in bodies or ()]
                if not made:
                    break  # nothing to follow up: the pipeline ends here
                requests = made
            results = await asyncio.gather(*(self._call(stage, began, request) for request in requests))
            calls += [call for call, _ in results]
            failed = next((call[3] for call, _ in results if not 200 <= call[3] < 300), None)
            if failed is not None:
                return failed, _NAN, _NAN, 0, tuple(calls)
            queue_total += max(_zero(call[4]) for call, _ in results)
            handler_total += max(_zero(call[5]) for call, _ in results)
            answers = [body for _, body in results]
        return 200, queue_total, handler_total, 0, tuple(calls)

    async def _call(self, stage: _Stage, began: float, request: bytes) -> tuple[StageCall, bytes]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            status, headers, body = await stage.pool.exchange(request)
        except (TimeoutError, asyncio.TimeoutError):
            status, headers, body = TIMEOUT, {}, b""
        except OSError:
            status, headers, body = CONNECTION, {}, b""
        end = loop.time()
        queue, handler, batch = read_timing(headers)
        return (stage.name, start - began, (end - start) * 1e3, status, queue, handler, batch), body

    async def _hook(
        self, loop: asyncio.AbstractEventLoop, stage: _Stage, index: int, source: int, answer: bytes
    ) -> list[bytes] | None:
        assert stage.hook is not None
        key = (source % len(self.sources), index, hashlib.sha1(answer).digest())
        if key in self.memo:
            self.memo.move_to_end(key)
            return self.memo[key]
        data = self.sources[key[0]]
        made: builtin.Made
        if stage.hook in _TRIVIAL:
            made = stage.hook(answer, data)
        else:  # off the event loop: a crop must not delay the sends due meanwhile
            made = await loop.run_in_executor(self.executor, stage.hook, answer, data)
        bodies = None if made is None else [made] if isinstance(made, bytes) else list(made)
        self.memo[key] = bodies
        if len(self.memo) > MEMO_SIZE:
            self.memo.popitem(last=False)
        return bodies

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.executor.shutdown(wait=False)


def _zero(value: float) -> float:
    return 0.0 if value != value else value  # NaN (no header) counts as nothing
