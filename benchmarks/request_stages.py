"""Where one request's time goes at concurrency 1, stage by stage, across the client, the frontend and the worker.

    python benchmarks/request_stages.py [--tree NAME=SRC ...] [--runs 3] [--requests 12000]

py-spy (``profile_frontend.py``) says where each process spends its CPU; it cannot say which of that time a request
waits for, nor how long the hand-offs between processes take. This script copies each source tree to a temporary
directory and marks 17 points of the no-op model's path (``servetune serve``, 1 worker, batch 1,
``POST /predictions/noop`` on one keep-alive connection) with ``time.perf_counter_ns()``: CLOCK_MONOTONIC, one clock
for every process of the host, so the frontend's marks, the worker's and the client's fall on one time line. Each
mark is inserted at an exact line of the copy (the tree itself is not changed); when a line moved, the script names
it and stops. Per request whose marks came in the expected order, the time between consecutive marks; per run, each
stage's median; per tree, the median over its runs (the runs rotate between the trees, A B B A, so the machine's
drift hits all). A mark costs about half a microsecond (measured and printed); the stages include it.

The stages (the mark that ends each):

    F0  the frontend's protocol gets the request's bytes (the client's send and the frontend's wake before it)
    F1  the direct route starts (the head's limits, HTTP parsing, the scope and cycle, the route's match: the fast
        way's for a request whole in one read, uvicorn's callbacks otherwise)
    F2  queued (the token, the body, TorchServe's request parsed, the gateway's job, in the batcher's queue)
    F3  the slot sends (the batch taken; where the slot's task sends it: the rest of the parser's callback, the
        loop's turn, the task's resumption; where the arrival sends it to a waiting worker, none of these)
    F4  sent (the frame encoded and written to the worker's socket)
    W0  the worker has the frame decoded (its wake, the read, the decode)
    W1  the handler's requests built
    W2  the handler service answered (servetune's handler contract around the no-op handle)
    W3  the result frame encoded
    W4  written back to the frontend
    F5  the frontend reads the result (its wake)
    F6  the batch's delivery starts (the frame decoded, in the read callback)
    F7  the answer's callback runs (each request's result set; in the same turn of the loop)
    F8  the answer rendered (the request's metrics, the headers)
    F9  written to the client (the head and body in one write)
    C1  the client has the answer (its wake, its read)
"""

from __future__ import annotations

import argparse
import bisect
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from noop_latency import read_response, request_bytes  # noqa: E402
from vs_torchserve import NOOP_HANDLER, archive  # noqa: E402

from servetune.embedded import EmbeddedServer  # noqa: E402

MARKS_MODULE = '''"""Marks of benchmarks/request_stages.py (this copy of the tree only)."""
import atexit
import os
import time

_marks = []
_ns = time.perf_counter_ns


def mark(tag):
    _marks.append((tag, _ns()))
    if len(_marks) >= 4096:  # written as they come: a worker may be killed at the end, with its frontend
        dump()


def dump():
    folder = os.environ.get("SERVETUNE_STAGE_MARKS")
    if folder and _marks:
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "a") as f:
            f.writelines(f"{t} {n}\\n" for t, n in _marks)
        _marks.clear()


atexit.register(dump)
'''

# (file, the exact source lines, the statement, before or after them). The statement is indented as the lines' first.
# (file, the line(s) to mark, the statement, where); a tuple of lines: the line in this tree, or the one it replaced
# in an earlier tree (so that two trees can be measured in one run)
MARKS: list[tuple[str | tuple[str, ...], str | tuple[str, ...], str, str]] = [
    ("api/http_limits.py", "    def data_received(self, data: bytes) -> None:\n        if self._between_requests()",
     "mark('F0')", "inside"),
    ("api/rest.py", "        gateway, scope = self.gateway, cast(Scope, cycle.scope)", "mark('F1')", "before"),
    ("server/batcher.py", "        self._queue.append(job)", "mark('F2')", "after"),
    ("server/process.py", "            channel.send(batches[0].encode() if len(batches) == 1", "mark('F3')",
     "before-try"),
    ("server/process.py", ("        self._pending.extend(zip(sent, now or [None] * len(sent), strict=True))",
                           "        self._pending.extend(sent)"), "mark('F4')", "after"),
    ("server/worker.py", "            message = decode_message(*frames.next())", "mark('W0')", "after"),
    ("server/worker.py", "        responses = service.predict(requests)", "mark('W1')", "before"),
    ("server/worker.py", "        responses = service.predict(requests)", "mark('W2')", "after"),
    ("server/worker.py", "        send(Result(answers, handler_ms, _gpu_memory(), cpu).encode())",
     "_frame = Result(answers, handler_ms, _gpu_memory(), cpu).encode(); mark('W3'); send(_frame); mark('W4')",
     "replace"),
    ("server/worker.py", "        except EOFError:\n            return\n        if not isinstance(message, Predict):",
     "dump()", "inside-except"),
    ("server/messages.py", "        if self._error is not None:\n            return\n        frames = self._frames",
     "mark('F5')", "before"),
    (("server/answers.py", "server/pool.py"),
     ("        request's ``on_answer`` runs now (``Job.answer``), not in a later turn of the loop.\"\"\"",
      '        """Each request of the batch its answer (one per request, else every request fails)."""'),
     "mark('F6')", "after"),
    ("api/rest.py", "        response: Response\n        if future.cancelled():", "mark('F7')", "before"),
    ("api/rest.py", "            cycle.write_now(response.status_code, response.fields, response.body)",
     "mark('F8')", "before"),
    ("api/rest.py", "            cycle.write_now(response.status_code, response.fields, response.body)",
     "mark('F9')", "after"),
]  # fmt: skip
TRAILING = 1000  # unmeasured requests after the measured ones (more than 4,096 marks of any process)
ORDER = ["F0", "F1", "F2", "F3", "F4", "W0", "W1", "W2", "W3", "W4", "F5", "F6", "F7", "F8", "F9"]
IMPORT = "from servetune._stage_marks import dump, mark  # noqa"


def marked_copy(src: Path, dest: Path) -> Path:
    """``src`` (a directory holding ``servetune``) copied to ``dest`` with the marks in; SystemExit naming the line
    when one is not found exactly once."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    package = dest / "servetune"
    (package / "_stage_marks.py").write_text(MARKS_MODULE)
    texts: dict[str, str] = {}

    def text_of(name: str) -> str:
        if name not in texts:
            path = package / name
            return path.read_text() if path.exists() else ""
        return texts[name]

    for names, alternatives, statement, where in MARKS:
        choices = (alternatives,) if isinstance(alternatives, str) else alternatives
        # a tuple of files: the file in this tree, or the one the lines were in in an earlier tree
        files = (names,) if isinstance(names, str) else names
        name = next((f for f in files if any(c in text_of(f) for c in choices)), files[0])
        text = text_of(name)
        found = [lines for lines in choices if text.count(lines) == 1]
        if len(found) != 1:
            shown = "\n".join(choices)
            raise SystemExit(f"{src}: {name}: the line to mark is not there exactly once (moved?):\n{shown}")
        lines = found[0]
        first = lines.splitlines()[0]
        indent = first[: len(first) - len(first.lstrip())]
        if where == "before":
            new = f"{indent}{statement}\n{lines}"
        elif where == "after":
            new = f"{lines}\n{indent}{statement}"
        elif where == "replace":
            new = f"{indent}{statement}"
        elif where == "inside":  # after the def line, in the body (the second line's indent)
            head, body = lines.split("\n", 1)
            inner = body[: len(body) - len(body.lstrip())]
            new = f"{head}\n{inner}{statement}\n{body}"
        elif where == "inside-except":  # before the ``return`` of the except
            head, ret, rest = lines.split("\n", 2)
            inner = ret[: len(ret) - len(ret.lstrip())]
            new = f"{head}\n{inner}{statement}\n{ret}\n{rest}"
        elif where == "before-try":  # before the ``try:`` that holds the line
            at = text.index(lines)
            try_at = text.rindex("try:\n", 0, at)
            line_start = text.rindex("\n", 0, try_at) + 1
            try_indent = text[line_start:try_at]
            texts[name] = text[:line_start] + f"{try_indent}{statement}\n" + text[line_start:]
            continue
        else:
            raise ValueError(where)
        texts[name] = text.replace(lines, new)
    for name, text in texts.items():
        # the import after the module's __future__ import (or at the top)
        future = "from __future__ import annotations\n"
        text = text.replace(future, f"{future}{IMPORT}\n", 1) if future in text else f"{IMPORT}\n{text}"
        (package / name).write_text(text)
    return dest


def run_once(src: Path, store: Path, requests: int, marks_dir: Path) -> dict[str, float]:
    """One server of the marked tree ``src``; ``requests`` round trips after a warm-up; each stage's median (µs)."""
    for f in marks_dir.glob("*.txt"):
        f.unlink()
    server = EmbeddedServer(store, {"noop": "noop.mar"}, {"default_workers_per_model": "1"})
    server.env["PYTHONPATH"] = str(src)
    server.env["SERVETUNE_STAGE_MARKS"] = str(marks_dir)
    server.start()
    client: list[tuple[int, int]] = []
    try:
        host, port = server.inference_url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request, buffer, ns = request_bytes(host, int(port)), bytearray(), time.perf_counter_ns
        for _ in range(2000):  # warm-up: marked too, and left out below
            sock.sendall(request)
            read_response(sock, buffer)
        for _ in range(requests):
            sent = ns()
            sock.sendall(request)
            read_response(sock, buffer)
            client.append((sent, ns()))
        for _ in range(TRAILING):  # the processes write their marks 4,096 at a time: these push the last ones out
            sock.sendall(request)
            read_response(sock, buffer)
        sock.close()
    finally:
        server.stop()
    deadline = time.monotonic() + 10.0
    while len(list(marks_dir.glob("*.txt"))) < 2 and time.monotonic() < deadline:  # the frontend's and the worker's
        time.sleep(0.1)
    events = sorted((int(n), tag) for f in marks_dir.glob("*.txt") for tag, n in (line.split() for line in f.open()))
    times = [n for n, _ in events]
    stages: dict[str, list[int]] = {}
    for sent, got in client:
        seq = events[bisect.bisect_left(times, sent) : bisect.bisect_right(times, got)]
        if [tag for _, tag in seq] != ORDER:
            continue  # a request some other mark fell into (none is expected), or one whose marks were not all there
        previous = ("C0", sent)
        for n, tag in [*seq, (got, "C1")]:
            stages.setdefault(f"{previous[0]}-{tag}", []).append(n - previous[1])
            previous = (tag, n)
        stages.setdefault("total", []).append(got - sent)
    if not stages:
        raise SystemExit(f"{src}: no request had its marks in order (marks files: {list(marks_dir.iterdir())})")
    result = {k: statistics.median(v) / 1000.0 for k, v in stages.items()}
    result["complete"] = len(stages["total"]) / len(client)
    return result


def mark_cost_us() -> float:
    namespace: dict[str, object] = {}
    exec(MARKS_MODULE, namespace)  # noqa: S102 - the module above, in process, to time one mark
    mark = namespace["mark"]
    n = 200_000
    started = time.perf_counter()
    for _ in range(n):
        mark("F0")  # type: ignore[operator]
    return (time.perf_counter() - started) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", help="NAME=PATH of a src directory (repeat; default: this tree)")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree, rotated between the trees")
    parser.add_argument("--requests", type=int, default=12000, help="measured round trips per run")
    args = parser.parse_args()
    trees = [(n, Path(p).resolve()) for n, _, p in (t.partition("=") for t in args.tree or [f"this={ROOT / 'src'}"])]
    print(f"a mark costs {mark_cost_us():.2f} us in process; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="request-stages-") as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        handler = work / "noop_handler.py"
        handler.write_text(NOOP_HANDLER)
        archive(store, "noop", str(handler))
        marks_dir = work / "marks"
        marks_dir.mkdir()
        copies = {name: marked_copy(path, work / f"tree-{name}") for name, path in trees}
        results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
        for run in range(args.runs):
            for name, _ in trees if run % 2 == 0 else trees[::-1]:
                row = run_once(copies[name], store, args.requests, marks_dir)
                results[name].append(row)
                print(
                    f"run {run} {name:>8}: total P50 {row['total']:.0f} us ({row['complete']:.0%} of the requests "
                    f"with every mark in order), load average {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    names = [name for name, _ in trees]
    keys = [k for k in results[names[0]][0] if k not in ("total", "complete")] + ["total"]
    print("\nmedian of the runs' medians, us:\n" + f"{'stage':<8}" + "".join(f"{n:>10}" for n in names))
    for key in keys:
        values = [statistics.median(r[key] for r in results[n]) for n in names]
        print(f"{key:<8}" + "".join(f"{v:10.1f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
