"""What changes to one model version do to another's answers on the Ray backend.

A no-op model is served with version 1.0 (``servetune serve --backend ray``, a private local Ray instance). A client
sends ``POST /predictions/noop/1.0`` at a fixed rate (open loop: each request on its own thread at its planned time,
30 s timeout) through the whole run, while the management API changes version 2.0 only: registers it, scales it to 0
workers and back ``--cycles`` times, makes it the default and back, and unregisters it (synchronous calls, as a
deployment script makes them). Prints, for the requests to 1.0: how many were sent and answered 200, the other
answers' statuses, the P50, P99 and longest latency, the longest gap between two 200s, and whether 1.0's worker pids
changed (a replica replaced).

    python benchmarks/ray_version_isolation.py [--cycles 3] [--rate 20]

Run it on two trees (``PYTHONPATH=<tree>/src``: the server, the driver and Ray's workers all import that tree) to
compare them; the numbers are this machine's, with whatever else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from servetune.embedded import EmbeddedServer

NOOP_HANDLER = """
def handle(data, context):
    if data is None:
        return None
    return ["OK"] * len(data)
"""


@dataclass
class Sent:
    at: float  # seconds since the load began, planned
    latency_s: float
    status: int  # 0: no answer (connection error or timeout)


def archives(store: Path, work: Path) -> None:
    """noop.mar (1.0) and noop2.mar (2.0), by TorchServe's archiver."""
    store.mkdir(parents=True, exist_ok=True)
    handler = work / "noop_handler.py"
    handler.write_text(NOOP_HANDLER)
    for version, name in (("1.0", "noop"), ("2.0", "noop2")):
        command = ["torch-model-archiver", "--model-name", "noop", "--version", version, "--handler", str(handler)]
        subprocess.run([*command, "--export-path", str(work), "--force"], check=True)
        (work / "noop.mar").rename(store / f"{name}.mar")


def call(method: str, url: str, body: bytes | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except OSError:
        return 0, b""


class Load:
    """Requests to ``url`` at ``rate`` per second, each on its own thread, until stopped."""

    def __init__(self, url: str, rate: float) -> None:
        self.url, self.rate = url, rate
        self.sent: list[Sent] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._runner = threading.Thread(target=self._run, daemon=True)

    def _one(self, at: float) -> None:
        started = time.monotonic()
        status, _ = call("POST", self.url, b"x")
        with self._lock:
            self.sent.append(Sent(at, time.monotonic() - started, status))

    def _run(self) -> None:
        begin = time.monotonic()
        n = 0
        while not self._stop.is_set():
            planned = n / self.rate
            delay = begin + planned - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            thread = threading.Thread(target=self._one, args=(planned,), daemon=True)
            thread.start()
            self._threads.append(thread)
            n += 1

    def __enter__(self) -> Load:
        self._runner.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._runner.join()
        for thread in self._threads:
            thread.join(60)


def pids(management: str) -> set[int]:
    status, body = call("GET", f"{management}/models/noop/1.0")
    return {int(w["pid"]) for w in json.loads(body)[0]["workers"]} if status == 200 else set()


def changes(management: str, cycles: int) -> list[tuple[str, int, float]]:
    """Version 2.0's life; each step's (what, status, seconds)."""
    steps = [("register 2.0", "POST", "/models?url=noop2.mar&initial_workers=1&synchronous=true")]
    for _ in range(cycles):
        steps.append(("scale 2.0 to 0", "PUT", "/models/noop/2.0?min_worker=0&synchronous=true"))
        steps.append(("scale 2.0 to 1", "PUT", "/models/noop/2.0?min_worker=1&synchronous=true"))
    steps.append(("2.0 the default", "PUT", "/models/noop/2.0/set-default"))
    steps.append(("1.0 the default", "PUT", "/models/noop/1.0/set-default"))
    steps.append(("unregister 2.0", "DELETE", "/models/noop/2.0"))
    done = []
    for what, method, path in steps:
        started = time.monotonic()
        status, _ = call(method, f"{management}{path}", timeout=300)
        done.append((what, status, time.monotonic() - started))
    return done


def report(sent: list[Sent], before: set[int], after: set[int], steps: list[tuple[str, int, float]]) -> None:
    for what, status, seconds in steps:
        print(f"  {what:<16} {status}  {seconds:5.1f} s")
    ok = sorted(s.latency_s * 1000 for s in sent if s.status == 200)
    others: dict[int, int] = {}
    for s in sent:
        if s.status != 200:
            others[s.status] = others.get(s.status, 0) + 1
    answered = sorted(s.at + s.latency_s for s in sent if s.status == 200)
    gap = max((b - a for a, b in zip(answered, answered[1:], strict=False)), default=0.0)
    print(f"requests to 1.0: {len(sent)} sent, {len(ok)} answered 200, others by status {others or 'none'}")
    if ok:
        p99 = ok[min(len(ok) - 1, int(0.99 * len(ok)))]
        print(f"  200s: P50 {statistics.median(ok):.1f} ms, P99 {p99:.1f} ms, longest {ok[-1]:.1f} ms")
    print(f"  longest time between two 200s: {gap:.2f} s")
    print(f"  1.0's worker pids: {sorted(before)} -> {sorted(after)} ({'same' if before == after else 'REPLACED'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3, help="times version 2.0 is scaled to 0 and back")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second to version 1.0")
    args = parser.parse_args()
    import servetune

    print(f"servetune from {Path(servetune.__file__).parent}; PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    with tempfile.TemporaryDirectory(prefix="ray-isolation-") as tmp:
        work = Path(tmp)
        archives(work / "store", work)
        properties = {
            "disable_token_authorization": "true",
            "default_workers_per_model": "1",
            "enable_model_api": "true",
        }
        server = EmbeddedServer(
            work / "store",
            {"noop": "noop.mar"},
            properties,
            workdir=work / "server",
            backend="ray",
            ray_address="local",
            ray_num_cpus=4,
        ).start()
        try:
            before = pids(server.management_url)
            with Load(f"{server.inference_url}/predictions/noop/1.0", args.rate) as load:
                time.sleep(2.0)
                steps = changes(server.management_url, args.cycles)
                time.sleep(2.0)
            after = pids(server.management_url)
        finally:
            server.stop()
    report(load.sent, before, after, steps)


if __name__ == "__main__":
    sys.exit(main())
