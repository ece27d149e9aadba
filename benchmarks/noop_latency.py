"""No-op latency at concurrency 1, servetune against servetune: an interleaved A/B of two source trees.

    python benchmarks/noop_latency.py --tree base=/tmp/base/src --tree new=src [--pairs 5] [--seconds 5]

Each tree serves the same no-op archive (``vs_torchserve.py``'s handler: 1 worker, batch 1) from its own server
process (``PYTHONPATH`` at that tree); all servers stay up for the whole run, and the runs rotate A, B, A, B, ... so
that the machine's drift hits both. The client is one keep-alive connection with a blocking socket and a fixed,
pre-built request (the same code for every tree, and cheaper than any HTTP library): each run sends requests one
after another for ``--seconds`` after a short warm-up and records each round trip. Prints per run the P50, P90 and
P99 in microseconds and the load average; at the end, per tree, the median and the spread of the runs' P50s, and
each tree's median P50 against the first tree's (the ratio of medians and the median of the pairwise ratios).
``--ab C`` adds to each run a closed loop of ``ab -k -c C`` (TorchServe's benchmark method) for as long: its
requests/s and the server's CPU per request (frontend and workers) at that concurrency, summarised the same way.
``--fresh`` starts a new server for every run (and stops it after), so that where one server's processes happened to
land (which cores, which memory) is not carried through every pair of the run: two servers of the same tree, kept up
for a whole run (an A/A run, 4 pairs), measured 1.14x apart in their median P50 and 1.16x in worker CPU per request
on this 2-core VM on 2026-12-06. ``--json FILE`` writes the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
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

WARMUP_S = 0.5


def request_bytes(host: str, port: int) -> bytes:
    return (
        f"POST /predictions/noop HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: text/plain\r\n"
        "Content-Length: 2\r\n\r\nhi"
    ).encode()


def read_response(sock: socket.socket, buffer: bytearray) -> None:
    """Read one response (head with ``Content-Length``, then its body) off ``sock``; what follows stays in
    ``buffer``."""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            break
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buffer += chunk
    head = bytes(buffer[:end]).lower()
    if not head.startswith(b"http/1.1 200"):
        raise RuntimeError(f"not a 200: {head[:200]!r}")
    at = head.find(b"content-length:")
    length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) >= 0 else len(head)])
    total = end + 4 + length
    while len(buffer) < total:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buffer += chunk
    del buffer[:total]


def measure(url: str, seconds: float) -> list[float]:
    """Round trips in microseconds, one request at a time on one keep-alive connection."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request, buffer, samples = request_bytes(host, int(port)), bytearray(), []
    try:
        warm_end = time.perf_counter() + WARMUP_S
        while time.perf_counter() < warm_end:
            sock.sendall(request)
            read_response(sock, buffer)
        end = time.perf_counter() + seconds
        now = time.perf_counter()
        while now < end:
            sock.sendall(request)
            read_response(sock, buffer)
            after = time.perf_counter()
            samples.append((after - now) * 1e6)
            now = after
    finally:
        sock.close()
    return samples


def ab_run(url: str, concurrency: int, seconds: float, body: Path) -> float:
    """``ab -k -c concurrency`` for ``seconds`` on the no-op: its requests/s (failed or non-2xx requests: an error)."""
    cmd = ["ab", "-k", "-c", str(concurrency), "-t", f"{seconds:g}", "-n", "100000000", "-p", str(body)]
    out = subprocess.run(
        [*cmd, "-T", "text/plain", f"{url}/predictions/noop"], capture_output=True, text=True, check=True
    ).stdout
    failed = re.search(r"Failed requests:\s+(\d+)", out)
    non_2xx = re.search(r"Non-2xx responses:\s+(\d+)", out)
    if (failed and int(failed.group(1))) or non_2xx:
        raise RuntimeError(f"ab saw failures:\n{out}")
    rate = re.search(r"Requests per second:\s+([\d.]+)", out)
    if rate is None:
        raise RuntimeError(f"ab printed no rate:\n{out}")
    return float(rate.group(1))


def server_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the server process (``frontend``) and of its children (``workers``)."""
    root = psutil.Process(pid)
    times = root.cpu_times()
    workers = 0.0
    for child in root.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        workers += t.user + t.system
    return {"frontend": times.user + times.system, "workers": workers}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a src directory (repeat)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--ab", type=int, default=0, help="then ab -k at this concurrency per run (0: none)")
    parser.add_argument(
        "--fresh", action="store_true", help="a new server (and worker) for every run, not one per tree for the run"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.ab and shutil.which("ab") is None:
        parser.error("--ab needs ab (Apache Bench: apt-get install apache2-utils)")
    trees = [(name, str(Path(path).resolve())) for name, _, path in (t.partition("=") for t in args.tree)]

    with tempfile.TemporaryDirectory(prefix="noop-latency-") as tmp:
        store = Path(tmp) / "store"
        store.mkdir()
        handler = Path(tmp) / "noop_handler.py"
        handler.write_text(NOOP_HANDLER)
        archive(store, "noop", str(handler))
        body = Path(tmp) / "body.txt"
        body.write_text("hi")
        servers: dict[str, EmbeddedServer] = {}

        def serve(name: str, src: str) -> None:
            server = EmbeddedServer(store, {"noop": "noop.mar"}, {"default_workers_per_model": "1"})
            server.env["PYTHONPATH"] = src
            servers[name] = server.start()

        try:
            if not args.fresh:
                for name, src in trees:
                    serve(name, src)
            runs: list[dict[str, object]] = []
            for pair in range(args.pairs):
                order = trees if pair % 2 == 0 else trees[::-1]
                for name, src in order:
                    if args.fresh:
                        serve(name, src)
                    pid = servers[name].proc.pid  # type: ignore[union-attr]
                    before = server_cpu_s(pid)
                    samples = measure(servers[name].inference_url, args.seconds)
                    after = server_cpu_s(pid)
                    n = len(samples) + 1  # the warm-up's requests are not counted: roughly one more per run
                    row = {
                        "tree": name,
                        "pair": pair,
                        "requests": len(samples),
                        "p50_us": quantile(samples, 0.5),
                        "p90_us": quantile(samples, 0.9),
                        "p99_us": quantile(samples, 0.99),
                        "loadavg": os.getloadavg()[0],
                        **{f"{k}_cpu_us": (after[k] - before[k]) * 1e6 / n for k in before},
                    }
                    line = (
                        f"pair {pair} {name:>8}: P50 {row['p50_us']:.0f} us  P90 {row['p90_us']:.0f}  "
                        f"P99 {row['p99_us']:.0f}; CPU/request frontend {row['frontend_cpu_us']:.0f} us, workers "
                        f"{row['workers_cpu_us']:.0f}  ({len(samples)} requests, load {row['loadavg']:.2f})"
                    )
                    if args.ab:
                        before = server_cpu_s(pid)
                        started = time.perf_counter()
                        rps = ab_run(servers[name].inference_url, args.ab, args.seconds, body)
                        after = server_cpu_s(pid)
                        n = rps * (time.perf_counter() - started)  # ab's own count is of its timed part
                        row["ab_rps"] = rps
                        row.update({f"ab_{k}_cpu_us": (after[k] - before[k]) * 1e6 / n for k in before})
                        line += (
                            f"; ab -k -c {args.ab}: {rps:.0f} req/s, CPU/request frontend "
                            f"{row['ab_frontend_cpu_us']:.0f} us, workers {row['ab_workers_cpu_us']:.0f}"
                        )
                    runs.append(row)
                    print(line, flush=True)
                    if args.fresh:
                        servers.pop(name).stop()
        finally:
            for server in servers.values():
                server.stop()

    first = trees[0][0]
    keys = [("p50_us", "P50"), ("frontend_cpu_us", "frontend CPU/req"), ("workers_cpu_us", "worker CPU/req")]
    if args.ab:
        keys += [
            ("ab_rps", f"ab -k -c {args.ab} req/s"),
            ("ab_frontend_cpu_us", f"c={args.ab} frontend CPU/req"),
            ("ab_workers_cpu_us", f"c={args.ab} worker CPU/req"),
        ]
    for key, label in keys:
        per_tree = {name: [float(str(r[key])) for r in runs if r["tree"] == name] for name, _ in trees}
        for name, _ in trees:
            values = per_tree[name]
            spread = f"runs {min(values):.0f}-{max(values):.0f}"
            unit = "" if key == "ab_rps" else " us"
            line = f"{name:>8} {label}: median {statistics.median(values):.0f}{unit} ({spread})"
            if name != first:
                ratios = [b / a for a, b in zip(per_tree[first], values, strict=True)]
                line += (
                    f"; vs {first}: {statistics.median(values) / statistics.median(per_tree[first]):.3f} "
                    f"(pairwise median {statistics.median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f})"
                )
            print(line)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
