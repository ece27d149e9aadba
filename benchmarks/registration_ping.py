"""Another client's ``/ping`` while heavy archives register (issue 19, item 4's YAML part): a "billion laughs"
model-config.yaml (9**7 strings once expanded), a 48-alias chain (3**16), and an archive of 8 MiB to extract.

    python benchmarks/registration_ping.py [--repeats 5] [--timeout 30]

A pinger sends ``GET /ping`` every 10 ms on its own connection while the management API registers each archive
``--repeats`` times (and deletes the one that registers). Prints, per archive, the answers to the registrations,
their time, and the pings' median, p99 and max. Run it against another checkout with ``PYTHONPATH=<src>``: a
registration that takes longer than ``--timeout`` is counted as such and the server is abandoned.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from models import CHAIN, ECHO_HANDLER, LAUGHS, handler_archive, yaml_archive  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402


def request(url: str, method: str, path: str, timeout: float) -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


class Pinger:
    """``GET /ping`` every 10 ms from a thread; the latencies of the pings sent within a window."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []  # (sent at, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                request(self.url, "GET", "/ping", 60.0)
            except OSError:
                pass
            self.samples.append((start, time.monotonic() - start))
            time.sleep(0.01)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(70)

    def window(self, start: float, end: float) -> list[float]:
        return [s for t, s in self.samples if start <= t <= end]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="registrations of each archive")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds one registration may take")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="registration-ping-") as tmp:
        store = Path(tmp) / "store"
        yaml_archive(store, "laughs", LAUGHS)
        yaml_archive(store, "chain", CHAIN)
        pad = ECHO_HANDLER + "\nPAD = " + repr(os.urandom(1 << 22).hex()) + "\n"
        handler_archive(store, "heavy", "echo.py", pad, {})
        props = {"enable_model_api": "true", "disable_token_authorization": "true", "default_workers_per_model": "0"}
        server = EmbeddedServer(store, None, props, workdir=Path(tmp) / "server", fail_on_model_error=False)
        server.start()
        mgmt = server.management_url
        print(f"loadavg {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {args.repeats} registrations each")
        print(
            f"{'archive':<8} {'answers':<16} {'register s':>11} {'pings':>6} {'median ms':>10} {'p99 ms':>8} "
            f"{'max ms':>8}"
        )
        try:
            with Pinger(server.inference_url) as pinger:
                for name in ("laughs", "chain", "heavy"):
                    answers: dict[str, int] = {}
                    took: list[float] = []
                    start = time.monotonic()
                    for _ in range(args.repeats):
                        t0 = time.monotonic()
                        try:
                            status = str(request(mgmt, "POST", f"/models?url={name}.mar", args.timeout))
                        except TimeoutError:
                            status = "timeout"
                        took.append(time.monotonic() - t0)
                        answers[status] = answers.get(status, 0) + 1
                        if status == "200":
                            request(mgmt, "DELETE", f"/models/{name}", args.timeout)
                        if status == "timeout":
                            break
                    pings = sorted(pinger.window(start, time.monotonic()))
                    p99 = pings[min(len(pings) - 1, int(len(pings) * 0.99))] if pings else float("nan")
                    shown = ",".join(f"{k}x{v}" for k, v in sorted(answers.items()))
                    print(
                        f"{name:<8} {shown:<16} {statistics.median(took):>11.3f} {len(pings):>6} "
                        f"{statistics.median(pings) * 1000 if pings else float('nan'):>10.1f} {p99 * 1000:>8.1f} "
                        f"{max(pings, default=float('nan')) * 1000:>8.1f}"
                    )
                    if "timeout" in answers:
                        print("a registration timed out: the server is stuck; stopping")
                        return 1
        finally:
            server.stop(5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
