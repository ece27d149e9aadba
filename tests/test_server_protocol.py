"""The frontend <-> worker frame format, and the batcher's collection rule."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servetune.api.types import InferRequest
from servetune.server.batcher import Batcher, Job, QueueFull
from servetune.server.protocol import ProtocolError, decode, encode, read_frame, recv_frame

headers = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20), st.none()), max_size=5)


@given(headers.filter(lambda h: "_blobs" not in h), st.lists(st.binary(max_size=200), max_size=6))
def test_frame_round_trip(header: dict[str, object], blobs: list[bytes]) -> None:
    frame = encode(header, blobs)
    assert decode(frame[4:]) == (header, blobs)


def test_frames_over_a_socket_pair() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode({"type": "predict", "n": 2}, [b"x" * 100_000, b""]))
        assert recv_frame(b) == ({"type": "predict", "n": 2}, [b"x" * 100_000, b""])
        a.close()
        with pytest.raises(EOFError):
            recv_frame(b)


def test_corrupt_frame_is_refused() -> None:
    frame = bytearray(encode({"a": 1}, [b"abc"]))
    with pytest.raises(ProtocolError):
        decode(bytes(frame[4:-1]))


def test_async_reader_matches_sync_writer() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=b)
        a.sendall(encode({"k": "v"}, [b"1", b"22"]))
        assert await read_frame(reader) == ({"k": "v"}, [b"1", b"22"])
        a.close()
        writer.close()

    asyncio.run(main())


def _job(loop: asyncio.AbstractEventLoop, name: str) -> Job:
    return Job(InferRequest(name, {}, [], time.monotonic()), loop.create_future())


def test_batcher_collects_up_to_batch_size_within_delay() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=3, max_delay_s=0.2, capacity=10)
        for i in range(5):
            batcher.put(_job(loop, str(i)))
        first = await batcher.next_batch()
        assert [j.request.request_id for j in first] == ["0", "1", "2"]
        start = loop.time()
        second = await batcher.next_batch()  # only 2 left: waits out the delay of the oldest, then goes
        assert [j.request.request_id for j in second] == ["3", "4"]
        assert loop.time() - start < 0.3

        # A lone request waits at most max_delay from its arrival, and a late one joins its batch.
        batcher.put(_job(loop, "a"))
        loop.call_later(0.05, lambda: batcher.put(_job(loop, "b")))
        start = loop.time()
        third = await batcher.next_batch()
        assert [j.request.request_id for j in third] == ["a", "b"]
        assert 0.15 <= loop.time() - start < 0.4

    asyncio.run(main())


def test_batcher_is_bounded_and_skips_abandoned_jobs() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=4, max_delay_s=0.0, capacity=2)
        gone, kept = _job(loop, "gone"), _job(loop, "kept")
        batcher.put(gone)
        batcher.put(kept)
        with pytest.raises(QueueFull):
            batcher.put(_job(loop, "x"))
        gone.request.is_disconnected = lambda: True
        assert [j.request.request_id for j in await batcher.next_batch()] == ["kept"]
        assert batcher.dropped_disconnected == 1 and gone.future.cancelled()

    asyncio.run(main())


def test_batcher_drops_a_job_whose_deadline_passed() -> None:
    """A client's deadline (gRPC's) travels with its request: once past it nobody waits, so it never runs."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=4, max_delay_s=0.0, capacity=10)
        late, due, open_ended = _job(loop, "late"), _job(loop, "due"), _job(loop, "open")
        late.request.deadline = time.monotonic() - 0.001
        due.request.deadline = time.monotonic() + 60.0
        for job in (late, due, open_ended):
            batcher.put(job)
        assert [j.request.request_id for j in await batcher.next_batch()] == ["due", "open"]
        assert batcher.dropped_disconnected == 1 and late.future.cancelled()

    asyncio.run(main())


def test_batcher_cancel_loses_nothing() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=2, max_delay_s=1.0, capacity=10)
        batcher.put(_job(loop, "only"))
        task = asyncio.create_task(batcher.next_batch())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(batcher) == 1

    asyncio.run(main())


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"max_delay_s": -1}, {"capacity": 0}])
def test_batcher_validates_arguments(kwargs: dict[str, float]) -> None:
    args = {"batch_size": 1, "max_delay_s": 0.0, "capacity": 1, **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Batcher(int(args["batch_size"]), float(args["max_delay_s"]), int(args["capacity"]))
