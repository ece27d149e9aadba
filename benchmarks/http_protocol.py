"""What servetune's HTTP protocol costs per prediction, in process: the fast way against the usual one.

    python benchmarks/http_protocol.py [--tree NAME=SRC ...] [--rounds 7] [--requests 20000]

The inference port's protocol (``api/http_limits.py``'s class, over ``api/http1.py``) is driven by hand on uvloop with
a transport that only counts its writes, and a direct route that answers at once (``cycle.write_now``), so what is
timed is the protocol alone: parsing, the head's limits, the scope and cycle, the route's start, the answer's write,
the keep-alive timer. Two shapes of the same keep-alive ``POST /predictions/noop`` (5 headers, an 8-byte JSON body):

- ``whole``: head and body in one read, as a keep-alive client sends a small prediction (the fast way,
  ``KeepAliveHttpToolsProtocol.direct_whole``, where the tree has it);
- ``parts``: the head in one read and the body in the next (always the usual way: uvicorn's parser and callbacks).

Each measurement is a child process (``PYTHONPATH`` at its tree) that warms up and times ``--requests`` requests of one
shape; the rounds run every tree's and every shape's child in turn, so that the machine's drift hits all. Prints each
shape's median and spread per tree, ``whole`` against ``parts`` within each tree, and each tree's shapes against the
first tree's. The machine's noise moves single rounds by 20-50% here: read the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, json, sys, time
import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState
from servetune.api.http_limits import HeaderLimits, guarded_protocol

HEAD = (b"POST /predictions/noop HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: bench\r\nAccept: */*\r\n"
        b"Content-Type: application/json\r\nContent-Length: 8\r\n\r\n")
BODY = b'{"x": 1}'

async def app(scope, receive, send):
    raise RuntimeError("the direct route takes every request here")

def start(cycle):
    bytes(cycle.body)
    cycle.write_now(200, [(b"content-type", b"application/json")], b'"OK"')

def direct(scope):
    return start if scope["method"] == "POST" and scope["path"] == "/predictions/noop" else None

class Transport:
    writes = 0
    def write(self, data): Transport.writes += 1
    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)
    def is_closing(self): return False
    def close(self): raise RuntimeError("closed")
    def pause_reading(self): pass
    def resume_reading(self): pass
    def get_protocol(self): return self.protocol

async def main(shape, requests):
    cls = guarded_protocol(HeaderLimits(), direct)
    config = Config(app, http=cls, log_level="warning", access_log=False)
    config.load()
    protocol = cls(config, ServerState(), {}, asyncio.get_running_loop())
    transport = Transport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    reads = {"whole": [HEAD + BODY], "parts": [HEAD, BODY]}[shape]
    for _ in range(2000):  # warm-up
        for data in reads:
            protocol.data_received(data)
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    for _ in range(requests):
        for data in reads:
            protocol.data_received(data)
    took = (time.perf_counter() - t0) / requests * 1e6
    assert Transport.writes == requests + 2000, "every request answered once"
    print(json.dumps(took))

uvloop.install()
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a src directory (repeat)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("this", str(ROOT / "src"))]
    shapes = ("whole", "parts")
    results: dict[str, dict[str, list[float]]] = {name: {shape: [] for shape in shapes} for name, _ in trees}
    for round_ in range(args.rounds):
        for name, src in trees if round_ % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            for shape in shapes if round_ % 2 == 0 else shapes[::-1]:
                run = subprocess.run(
                    [sys.executable, "-c", CHILD, shape, str(args.requests)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if run.returncode != 0:
                    sys.exit(f"tree {name}: {run.stderr.strip()}")
                results[name][shape].append(json.loads(run.stdout))
        print(
            f"round {round_ + 1}: "
            + "; ".join(
                f"{name} " + " ".join(f"{shape} {results[name][shape][-1]:.1f}" for shape in shapes)
                for name, _ in trees
            )
        )
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("\nmicroseconds per request, median (min-max) of the rounds:")
    first = results[trees[0][0]]
    for name, got in results.items():
        medians = {shape: statistics.median(got[shape]) for shape in shapes}
        line = f"{name:>8}: " + ", ".join(
            f"{shape} {medians[shape]:.1f} ({min(got[shape]):.1f}-{max(got[shape]):.1f})" for shape in shapes
        )
        line += f"; whole/parts {medians['whole'] / medians['parts']:.3f}"
        if got is not first:
            line += (
                "; against "
                + trees[0][0]
                + ": "
                + ", ".join(f"{shape} {medians[shape] / statistics.median(first[shape]):.3f}" for shape in shapes)
            )
        print(line)


if __name__ == "__main__":
    main()
