"""The frontend <-> worker frame format, and the batcher's collection rule."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from servetune._exceptions import ApiError
from servetune.api.types import InferRequest, InferResult
from servetune.server.batcher import Batcher, Job, QueueFull
from servetune.server.messages import (
    FrameBuffer,
    FrameProtocol,
    ProtocolError,
    SocketFrames,
    decode,
    encode,
    recv_chunk,
    recv_frame,
)

headers = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20), st.none()), max_size=5)


@given(headers.filter(lambda h: "_blobs" not in h), st.lists(st.binary(max_size=200), max_size=6))
@example({"": -(2**63) - 1}, [])  # past 64 bits: written by json, and read back as the integer, not a float
@example({"big": 2**64, "lone": "\ud800"}, [b"x"])
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


def test_a_worker_reads_frames_of_any_size_however_they_arrive() -> None:
    """Several small frames in one recv, a frame cut anywhere, frames larger than what one recv asks for, values
    orjson refuses (written and read by json instead)."""
    sent = [
        ({"type": "predict", "n": 0}, [b"a"]),
        ({"type": "predict", "n": 1}, [b"b" * 200_000, b""]),
        ({"big": 2**70, "text": "\ud800"}, []),
        ({"type": "predict", "n": 3}, [b"c" * 65_530]),
        ({"type": "predict", "n": 4}, []),
    ]
    stream = b"".join(encode(header, blobs) for header, blobs in sent)
    a, b = socket.socketpair()
    with a, b:
        frames = SocketFrames(b)
        for cut in (0, 3, 9, 70_000, 200_100, len(stream) - 1):  # sent in two parts, cut here
            parts = (stream[:cut], stream[cut:])
            sender = threading.Thread(target=lambda parts=parts: [a.sendall(part) for part in parts])
            sender.start()
            assert [frames.next() for _ in sent] == sent
            sender.join()
        a.close()
        with pytest.raises(EOFError):
            frames.next()


def test_corrupt_frame_is_refused() -> None:
    frame = bytearray(encode({"a": 1}, [b"abc"]))
    with pytest.raises(ProtocolError):
        decode(bytes(frame[4:-1]))


def test_the_frontends_frame_protocol_reads_frames_however_they_arrive() -> None:
    """The event loop's end (``FrameProtocol``, a worker's socket in the frontend): frames cut anywhere, several in
    one read, one larger than a read; then a malformed frame ends the connection with a ProtocolError, and frames
    after it are not delivered."""
    sent = [
        ({"type": "result", "n": 0}, [b"a"]),
        ({"type": "result", "n": 1}, [b"b" * 300_000, b""]),
        ({"big": 2**70, "text": "\ud800"}, []),
        ({"type": "result", "n": 3}, []),
    ]
    stream = b"".join(encode(header, blobs) for header, blobs in sent)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for cut in (0, 3, 9, 70_000, len(stream) - 1):
            a, b = socket.socketpair()
            got: list[tuple[dict[str, object], list[bytes]]] = []
            lost: asyncio.Future[BaseException | None] = loop.create_future()
            made = FrameProtocol(lambda h, bl, got=got: got.append((h, bl)), lost.set_result)
            _, protocol = await loop.create_unix_connection(lambda made=made: made, sock=b)
            with a:
                a.setblocking(False)
                for part in (stream[:cut], stream[cut:]):
                    await loop.sock_sendall(a, part)
                    await asyncio.sleep(0.01)
                while len(got) < len(sent):
                    await asyncio.sleep(0.01)
                assert got == sent
                frame = encode({"type": "predict"}, [b"x" * 100_000])  # and it writes, past a socket's buffer
                protocol.send(frame)
                drained = asyncio.ensure_future(protocol.drain())
                echoed = b""
                while len(echoed) < len(frame):
                    echoed += await loop.sock_recv(a, 1 << 16)
                await drained
                assert decode(echoed[4:]) == ({"type": "predict"}, [b"x" * 100_000])
                bad = bytearray(encode({"a": 1}, [b"abc"]))
                await loop.sock_sendall(a, bytes(bad[:4]) + b"\xff" * (len(bad) - 4) + encode({"n": 9}, []))
                error = await asyncio.wait_for(lost, 5)
            assert isinstance(error, ProtocolError)
            assert len(got) == len(sent)  # the frame after the malformed one was not delivered
            with pytest.raises(ConnectionResetError):
                protocol.send(b"x")

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


def test_batcher_gives_batches_already_due_only_when_no_worker_waits_to_collect() -> None:
    """``take_ready`` (a light model's worker takes several batches at once): a full batch, or one whose oldest
    request waited past the delay; nothing while another worker collects, nothing under a controller's deadlines."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=2, max_delay_s=0.05, capacity=10)
        for i in range(5):
            batcher.put(_job(loop, str(i)))
        assert [j.request.request_id for j in batcher.take_ready()] == ["0", "1"]
        assert [j.request.request_id for j in batcher.take_ready()] == ["2", "3"]
        assert batcher.take_ready() == []  # one request left, within its delay
        await asyncio.sleep(0.06)
        assert [j.request.request_id for j in batcher.take_ready()] == ["4"]

        for i in range(4):
            batcher.put(_job(loop, f"c{i}"))
        batcher.dispatch_by = lambda first, queued: first + 1.0
        assert batcher.take_ready() == []  # a controller decides when batches go
        batcher.dispatch_by = None

        async with batcher._collecting:  # another worker waits to collect: the queue is its
            assert batcher.take_ready() == []
        assert [j.request.request_id for j in batcher.take_ready()] == ["c0", "c1"]

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
    """A client's deadline travels with its request: once past it the request never runs; a client still waiting
    (REST's ``x-servetune-timeout-ms``) is answered 504."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=4, max_delay_s=0.0, capacity=10)
        late, due, open_ended = _job(loop, "late"), _job(loop, "due"), _job(loop, "open")
        late.request.deadline = time.monotonic() - 0.001
        due.request.deadline = time.monotonic() + 60.0
        for job in (late, due, open_ended):
            batcher.put(job)
        assert [j.request.request_id for j in await batcher.next_batch()] == ["due", "open"]
        assert batcher.dropped_disconnected == 1 and not late.future.cancelled()
        error = late.future.exception()  # its client still waits (nothing says it went): a 504 at once, not silence
        assert isinstance(error, ApiError) and error.status == 504 and "deadline passed" in error.message

    asyncio.run(main())


def test_a_reserve_worker_takes_only_what_is_due_and_collects_again_once_released() -> None:
    """A worker a controller holds in reserve takes the oldest requests only when they must go to make their deadline
    (``dispatch_by``: here 0.2 s after the oldest arrived), never what a collecting worker takes first; released from
    the reserve, it collects as any other does."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=4, max_delay_s=0.0, capacity=10)
        batcher.dispatch_by = lambda first, queued: first + 0.2
        held = [True]
        batcher.put(_job(loop, "a"))
        start = time.monotonic()
        reserve = asyncio.create_task(batcher.next_batch(lambda: held[0]))
        await asyncio.sleep(0.05)
        batcher.put(_job(loop, "b"))  # an arrival wakes it: still not due
        await asyncio.sleep(0.05)
        assert not reserve.done()
        taken = await reserve
        assert [j.request.request_id for j in taken] == ["a", "b"] and batcher.last_reason == "reserve"
        assert 0.19 <= time.monotonic() - start < 0.4

        # a collecting worker takes what arrives at once; the reserve takes nothing of it
        reserve = asyncio.create_task(batcher.next_batch(lambda: held[0]))
        batcher.put(_job(loop, "c"))
        assert [j.request.request_id for j in await batcher.next_batch()] == ["c"]
        await asyncio.sleep(0.3)
        assert not reserve.done() and len(batcher) == 0

        # released: it collects the next arrival at once, long before the deadline would call the reserve
        held[0] = False
        batcher.wake_reserve()
        batcher.put(_job(loop, "d"))
        start = time.monotonic()
        assert [j.request.request_id for j in await reserve] == ["d"] and batcher.last_reason != "reserve"
        assert time.monotonic() - start < 0.15

    asyncio.run(main())


def test_a_reserve_worker_wakes_only_for_an_arrival_that_makes_the_batch_due_sooner() -> None:
    """A waiting reserve worker is woken by an arrival only when the queue's batch is due sooner than it will look
    anyway (each wake-up cost the event loop ~14 us per arrival, measured in process): more requests queued make a
    longer batch, whose oldest must go sooner; an arrival that leaves the due time as it was wakes nobody."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=8, max_delay_s=0.0, capacity=10)
        batcher.dispatch_by = lambda first, queued: first + 0.5
        batcher.reserve_by = lambda first, queued: first + (0.6 if queued < 3 else 0.1)  # three: due sooner
        woken = [0]
        wake = batcher._reserve_wake.set

        def counted() -> None:
            woken[0] += 1
            wake()

        batcher._reserve_wake.set = counted  # type: ignore[method-assign]
        start = time.monotonic()
        batcher.put(_job(loop, "a"))
        reserve = asyncio.create_task(batcher.next_batch(lambda: True))
        await asyncio.sleep(0.02)
        batcher.put(_job(loop, "b"))  # due as before (0.6 s after a): nobody woken
        await asyncio.sleep(0.02)
        assert woken[0] == 0 and not reserve.done()
        batcher.put(_job(loop, "c"))  # three queued: due 0.1 s after a, sooner than the reserve would look
        taken = await reserve
        assert woken[0] == 1 and [j.request.request_id for j in taken] == ["a", "b", "c"]
        assert batcher.last_reason == "reserve" and 0.09 <= time.monotonic() - start < 0.4

    asyncio.run(main())


def test_a_reserve_worker_that_looked_at_an_empty_queue_still_hears_the_next_arrival() -> None:
    """The reserve looked at a request a collecting worker took first, and found the queue empty: the next arrival,
    with every collecting worker busy, is still taken at its due time. (The reserve's next look was remembered as the
    taken request's, already past, so no arrival seemed due sooner and none woke it: in a quick benchmark run the
    reserve workers served 2 batches in 60 s while batches whose oldest request had waited past their due time went
    late on the collecting workers.)"""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=4, max_delay_s=0.0, capacity=10)
        batcher.dispatch_by = lambda first, queued: first + 0.1
        reserve = asyncio.create_task(batcher.next_batch(lambda: True))
        batcher.put(_job(loop, "a"))
        await asyncio.sleep(0)
        assert [j.request.request_id for j in await batcher.next_batch()] == ["a"]  # a collecting worker's
        await asyncio.sleep(0.15)  # the reserve's look at a's due time: nothing queued
        assert not reserve.done()
        start = time.monotonic()
        batcher.put(_job(loop, "b"))  # the collecting worker is busy: b is the reserve's at its due time
        taken = await asyncio.wait_for(reserve, 1.0)
        assert [j.request.request_id for j in taken] == ["b"] and batcher.last_reason == "reserve"
        assert 0.09 <= time.monotonic() - start < 0.3

    asyncio.run(main())


def test_batcher_answers_a_queued_deadline_at_the_deadline() -> None:
    """Nobody asks for a batch (every worker busy): a queued job is answered 504 at its deadline, and leaves the
    queue; a job taken into a batch before its deadline is left alone when the deadline passes while it runs."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        batcher = Batcher(batch_size=1, max_delay_s=0.0, capacity=10)
        running, waiting, other = _job(loop, "running"), _job(loop, "waiting"), _job(loop, "other")
        running.request.deadline = time.monotonic() + 0.05
        waiting.request.deadline = time.monotonic() + 0.05
        batcher.put(running)
        assert [j.request.request_id for j in await batcher.next_batch()] == ["running"]
        batcher.put(waiting)
        batcher.put(other)  # no deadline: it stays
        start = loop.time()
        with pytest.raises(ApiError) as raised:
            await asyncio.wait_for(waiting.future, 1.0)  # with no timer it would wait for the next batch
        assert raised.value.status == 504 and loop.time() - start < 0.2
        assert len(batcher) == 1 and batcher.dropped_disconnected == 1
        await asyncio.sleep(0.01)
        assert not running.future.done()  # its deadline passed while it ran: the worker's answer decides
        assert [j.request.request_id for j in await batcher.next_batch()] == ["other"]

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


def test_a_batch_due_on_arrival_goes_to_the_waiting_worker_from_the_arrival_itself() -> None:
    """A worker waits (``next_batch(direct=...)``): the arrival that makes its batch due (full, or no delay) sends the
    batch before ``put`` returns, once per wait; the worker's wait then returns that very batch. Not for a batch
    that is not due yet, a solo request, or under a controller's deadlines; when the send is refused the worker
    collects the same jobs as usual."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sent: list[list[str]] = []
        refuse = False

        def direct(batch: list[Job]) -> bool:
            if refuse:
                return False
            sent.append([j.request.request_id for j in batch])
            return True

        async def waiting(batcher: Batcher) -> asyncio.Task[list[Job]]:
            task = asyncio.create_task(batcher.next_batch(direct=direct))
            await asyncio.sleep(0)  # it waits for the first arrival now
            return task

        def ids(batch: list[Job]) -> list[str]:
            return [j.request.request_id for j in batch]

        batcher = Batcher(batch_size=3, max_delay_s=1.0, capacity=10)
        task = await waiting(batcher)
        batcher.put(_job(loop, "a"))
        await asyncio.sleep(0.01)  # the worker collects: a, then waits for more within the delay
        batcher.put(_job(loop, "b"))
        assert sent == []  # not due: two of three, well within the delay
        batcher.put(_job(loop, "c"))
        assert sent == [["a", "b", "c"]]  # sent from the arrival, before any turn of the loop
        batcher.put(_job(loop, "d"))  # the same turn: the worker has its batch, this one waits in the queue
        assert sent == [["a", "b", "c"]] and len(batcher) == 1
        assert ids(await task) == ["a", "b", "c"] and batcher.last_reason == "full"
        assert ids(await batcher.next_batch()) == ["d"]  # (its delay ran out)

        batcher = Batcher(batch_size=4, max_delay_s=0.0, capacity=10)  # no delay: due on arrival, however few
        task = await waiting(batcher)
        batcher.put(_job(loop, "x"))
        assert sent[-1] == ["x"] and ids(await task) == ["x"]

        task = await waiting(batcher)
        refuse = True  # e.g. the worker went meanwhile: the worker's task collects the jobs itself
        batcher.put(_job(loop, "y"))
        assert sent[-1] == ["x"] and ids(await task) == ["y"]
        refuse = False

        task = await waiting(batcher)
        solo = _job(loop, "solo")
        solo.request.on_partial = lambda _: None  # a stream: a batch of its own, collected as such
        batcher.put(solo)
        assert sent[-1] == ["x"] and ids(await task) == ["solo"] and batcher.last_reason == "solo"

        batcher.dispatch_by = lambda first, queued: first  # a controller's deadlines: it decides when batches go
        task = await waiting(batcher)
        batcher.put(_job(loop, "z"))
        assert sent[-1] == ["x"] and ids(await task) == ["z"]

    asyncio.run(main())


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"max_delay_s": -1}, {"capacity": 0}])
def test_batcher_validates_arguments(kwargs: dict[str, float]) -> None:
    args = {"batch_size": 1, "max_delay_s": 0.0, "capacity": 1, **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Batcher(int(args["batch_size"]), float(args["max_delay_s"]), int(args["capacity"]))


def test_frames_carry_their_own_file_descriptors_whatever_the_chunks() -> None:
    """Descriptors sent with frames (SCM_RIGHTS) come out with the frame each was sent with, though the reader's
    chunks cut across frames; what nobody took is closed."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pipes = [os.pipe() for _ in range(3)]
    try:
        frames = [encode({"n": 0}, [b"x" * 70_000], fds=1), encode({"n": 1}), encode({"n": 2}, fds=2)]
        socket.send_fds(ours, [frames[0]], [pipes[0][1]])
        ours.sendall(frames[1])
        socket.send_fds(ours, [frames[2]], [pipes[1][1], pipes[2][1]])
        buffer, got = FrameBuffer(), []
        while len(got) < 3:
            data, fds = recv_chunk(theirs, 4096)  # small chunks: a frame's bytes and its descriptors arrive apart
            buffer.feed(data, fds)
            while (frame := buffer.next_frame()) is not None:
                got.append(frame)
        assert [(h["n"], [len(b) for b in blobs], len(fds)) for h, blobs, fds in got] == [
            (0, [70_000], 1),
            (1, [], 0),
            (2, [], 2),
        ]
        received = [fd for _, _, fds in got for fd in fds]
        for fd, (read_end, _) in zip(received, pipes, strict=True):  # each one is the pipe it was sent as
            os.write(fd, b"!")
            assert os.read(read_end, 1) == b"!"
            os.close(fd)
        spare = os.dup(pipes[0][0])
        buffer.feed(b"", [spare])
        buffer.close()  # a descriptor no frame took is closed
        with pytest.raises(OSError):
            os.fstat(spare)
    finally:
        ours.close()
        theirs.close()
        for read_end, write_end in pipes:
            os.close(read_end)
            os.close(write_end)


def test_a_frame_that_claims_more_descriptors_than_came_is_refused() -> None:
    buffer = FrameBuffer()
    buffer.feed(encode({"n": 0}, fds=1), [])
    with pytest.raises(ProtocolError, match="carries 1 file descriptors, 0 came"):
        buffer.next_frame()


def test_a_jobs_answer_runs_its_requests_on_answer_in_the_same_turn_and_once() -> None:
    """``Job.answer``: the request's ``on_answer`` (a done callback of its future) runs before ``answer`` returns,
    not a turn of the loop later, and is not run again as a scheduled callback; the future's other callbacks run as
    usual. Without ``on_answer`` (or once it was removed), ``answer`` is ``set_result``."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job = _job(loop, "now")
        seen: list[str] = []

        def on_answer(future: asyncio.Future[InferResult]) -> None:
            seen.append(f"now:{future.result().status}")

        job.request.on_answer = on_answer
        job.future.add_done_callback(on_answer)
        job.future.add_done_callback(lambda _: seen.append("other"))
        job.answer(InferResult(200, b"", None))
        assert seen == ["now:200"]  # before any turn of the loop
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert seen == ["now:200", "other"]

        plain = _job(loop, "plain")
        plain.future.add_done_callback(lambda f: seen.append(f"plain:{f.result().status}"))
        plain.answer(InferResult(201, b"", None))
        assert seen[-1] == "other"  # scheduled, as set_result schedules
        await asyncio.sleep(0)
        assert seen[-1] == "plain:201"

        failing = _job(loop, "failing")

        def broken(_: asyncio.Future[InferResult]) -> None:
            raise RuntimeError("a bug in the answer's callback")

        failing.request.on_answer = broken
        failing.future.add_done_callback(broken)
        failing.answer(InferResult(200, b"", None))  # logged, as the loop logs a callback's failure; not raised
        assert failing.future.result().status == 200

    asyncio.run(main())
