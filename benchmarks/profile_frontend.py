"""Where the native server's CPU goes per request: py-spy samples of the frontend and its worker under ``ab -k``.

    python benchmarks/profile_frontend.py [--concurrency 16] [--seconds 20] [--rate 250] [--out DIR]

Starts ``servetune serve`` with a no-op model (1 worker, batch 1), drives ``POST /predictions/noop`` with
``ab -k -c C`` (TorchServe's benchmark method), and meanwhile records the frontend and the worker with
``py-spy record --gil --format raw`` (only samples that hold the GIL: shares are of the Python CPU time, not of
wall time). Prints, per process, the CPU time per request (user and system, from /proc) and the functions and files
ranked by inclusive and self share of the samples; writes the raw (collapsed) stacks per process to ``--out``
(flamegraph.pl and speedscope read them).
Needs ``ab`` and ``py-spy``; py-spy needs ptrace rights (root, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from vs_torchserve import NOOP_HANDLER, archive  # noqa: E402

from servetune.embedded import EmbeddedServer  # noqa: E402

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::\d+)?\)$")


def parse_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) format: ``frame;frame;...;frame count`` per line, the leaf last."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def label(frame: str) -> str:
    """``function (file)`` with the file shortened to its package path."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match.group("file")
    for marker in ("site-packages/", "lib/python3.11/", "src/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match.group('func')} ({path})"


def file_of(frame: str) -> str:
    return label(frame).rpartition("(")[2].rstrip(")")


# Concerns, each a (name, path or function fragments) rule. A sample goes to the concern of the frame nearest the leaf
# that matches a rule: json.dumps called from protocol.encode counts as worker framing, dict(request.headers) as
# headers. Order matters only within one frame.
CONCERNS = [
    ("thread count per batch (psutil /sys glob)", ("hardware.py", "worker_threads", "psutil/")),
    ("metrics (prometheus_client, servetune metrics)", ("prometheus_client/", "servetune/api/metrics.py")),
    ("handler metrics (worker: context.metrics)", ("servetune/handlers/metrics.py",)),
    (  # the frontend's end of the worker's socket (its writes, their flow control) before the frames' encoding
        "worker pipe (process.py, FrameProtocol's socket writes, asyncio streams)",
        ("servetune/server/process.py", "FrameProtocol.send", "FrameProtocol.drain", "asyncio/streams.py"),
    ),
    (
        "worker framing (protocol.py, messages.py, JSON)",
        ("servetune/server/messages.py", "orjson", "json/"),
    ),
    ("batcher and dispatch (batcher.py, model.py)", ("servetune/server/batcher.py", "servetune/server/model.py")),
    ("request id (uuid4)", ("uuid.py",)),
    ("request headers (starlette Headers, dict copy)", ("starlette/datastructures.py",)),
    (
        "response object and headers (starlette Response, timing headers, one write)",
        ("starlette/responses.py", "answer_response", "servetune/api/http1.py"),
    ),
    ("body read (request.stream)", ("read_body", "starlette/requests.py")),
    ("multipart/form parsing", ("multipart", "starlette/formparsers.py", "parse_inputs")),
    (
        "Starlette routing and middleware",
        ("starlette/", "uvicorn/middleware/"),
    ),
    (
        "HTTP parse/serialise (uvicorn httptools, keep-alive, head limits)",
        ("uvicorn/protocols/", "servetune/api/http1.py"),
    ),
    ("socket reads/writes (asyncio transport)", ("asyncio/selector_events.py",)),
    (
        "predictions endpoint and gateway (torchserve_rest.py, rest.py, gateway.py)",
        ("servetune/api/torchserve_rest.py", "servetune/api/rest.py", "servetune/api/gateway.py"),
    ),
    ("worker handler contract (service.py, envelopes)", ("servetune/handlers/",)),
    ("event loop, tasks, futures (asyncio)", ("asyncio/", "selectors.py", "_weakrefset.py", "contextvars")),
]


def concern(frames: list[str]) -> str:
    for frame in reversed(frames):
        name = label(frame)
        for title, fragments in CONCERNS:
            if any(fragment in name for fragment in fragments):
                return title
    return "other"


def rank(stacks: list[tuple[list[str], int]], top: int) -> None:
    total = sum(count for _, count in stacks) or 1
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        labels = [label(f) for f in frames]
        for name in set(labels):
            inclusive[name] += count
        own[labels[-1]] += count
        modules[file_of(frames[-1])] += count
    print(f"  {total} samples")
    concerns: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        concerns[concern(frames)] += count
    print("  by concern (each sample counted once, for the frame nearest the leaf that names one):")
    for name, count in concerns.most_common():
        print(f"    {100 * count / total:5.1f}%  {name}")
    print("  inclusive (share of CPU samples with the function on the stack):")
    for name, count in inclusive.most_common(top):
        print(f"    {100 * count / total:5.1f}%  {name}")
    print("  self (leaf frame):")
    for name, count in own.most_common(top):
        print(f"    {100 * count / total:5.1f}%  {name}")
    print("  self, by file:")
    for name, count in modules.most_common(top):
        print(f"    {100 * count / total:5.1f}%  {name}")


def cpu_seconds(proc: psutil.Process) -> tuple[float, float]:
    """(user, system) CPU seconds of the process."""
    times = proc.cpu_times()
    return times.user, times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds sampled (ab runs 5 s longer)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("profile-frontend"))
    args = parser.parse_args()
    for tool in ("ab", "py-spy"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} on PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        store.mkdir()
        handler = Path(tmp) / "noop_handler.py"
        handler.write_text(NOOP_HANDLER)
        archive(store, "noop", str(handler))
        body = Path(tmp) / "body"
        body.write_bytes(b"hello")
        properties = {"disable_token_authorization": "true", "default_workers_per_model": "1"}
        with EmbeddedServer(store, {"noop": "noop.mar"}, properties) as server:
            assert server.proc is not None
            frontend = psutil.Process(server.proc.pid)
            [worker] = [p for p in frontend.children(recursive=True) if "servetune.server.worker" in p.cmdline()]
            url = f"{server.inference_url}/predictions/noop"
            ab = ["ab", "-k", "-c", str(args.concurrency), "-t", f"{args.seconds + 5:g}", "-n", "100000000"]
            ab += ["-p", str(body), "-T", "application/octet-stream", url]
            load = subprocess.Popen(ab, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            time.sleep(2.0)  # past ab's connection set-up
            spies, before = {}, {}
            procs = {"frontend": frontend, "worker": worker}
            for name, proc in procs.items():
                before[name] = cpu_seconds(proc)
                cmd = ["py-spy", "record", "-p", str(proc.pid), "-r", str(args.rate), "-d", f"{args.seconds:g}"]
                # --gil: only samples holding the GIL, i.e. running Python (or C called from it without releasing
                # the GIL). Blocking waits (epoll, recv, a queue) release it; py-spy's own idle detection counted them
                # as busy here. Syscalls that release the GIL (send, recv) are the "system" CPU printed beside.
                cmd += ["--gil", "--nonblocking", "--format", "raw", "-o", str(args.out / f"{name}.txt")]
                spies[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = time.monotonic()
            for spy in spies.values():
                spy.wait()
            elapsed = time.monotonic() - start
            used = {}
            for name, proc in procs.items():
                user, system = cpu_seconds(proc)
                used[name] = (user - before[name][0], system - before[name][1])
            report, _ = load.communicate()
    completed = re.search(r"^Requests per second:\s+([\d.]+)", report, re.MULTILINE)
    rps = float(completed.group(1)) if completed else float("nan")
    print(f"ab -k -c {args.concurrency}: {rps:.0f} req/s over the whole ab run")
    for name in ("frontend", "worker"):
        user, system = used[name]
        per_request = 1e6 / (rps * elapsed) if rps > 0 else float("nan")
        print(
            f"\n{name}: {(user + system) / elapsed * 100:.0f}% of a core; CPU per request: "
            f"{(user + system) * per_request:.0f} us ({user * per_request:.0f} user, {system * per_request:.0f} system)"
        )
        rank(parse_raw(args.out / f"{name}.txt"), args.top)


if __name__ == "__main__":
    main()
