"""Soak: mixed good and bad traffic with random worker kills; every request must get exactly one answer.

    python benchmarks/soak.py [--minutes 5] [--clients 8] [--kill-every 5]

Prints requests sent, answered, answers by status, hung (no answer within the client timeout) and lost
(connection dropped without an answer). hung and lost must both be 0; the exit code says whether they were.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from models import sleep_archive  # noqa: E402
from servetune.embedded import EmbeddedServer  # noqa: E402

MALFORMED = b'--b\r\nContent-Disposition: form-data; name="data"\r\n\r\nno closing boundary'
KINDS = [  # (weight, name)
    (71, "good"),
    (8, "boom"),
    (1, "exit"),
    (5, "oversize"),
    (5, "malformed"),
    (5, "unknown_model"),
    (5, "empty"),
]


async def one(session: aiohttp.ClientSession, base: str, kind: str, timeout: float) -> str:
    url, data, headers = f"{base}/predictions/sleep", b"ok", {"Content-Type": "application/octet-stream"}
    if kind == "boom":
        data = b"boom"
    elif kind == "exit":
        data = b"exit"
    elif kind == "oversize":
        data = b"x" * 20_000
    elif kind == "malformed":
        data, headers = MALFORMED, {"Content-Type": "multipart/form-data; boundary=b"}
    elif kind == "unknown_model":
        url = f"{base}/predictions/nope"
    elif kind == "empty":
        data = b""
    try:
        async with session.post(url, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await resp.read()
            return str(resp.status)
    except TimeoutError:
        return "hung"
    except aiohttp.ClientError:
        return "lost"


async def soak(
    base: str, mgmt: str, minutes: float, clients: int, kill_every: float, timeout: float
) -> collections.Counter[str]:
    rng = random.Random(0)
    weights, names = zip(*KINDS, strict=True)
    results: collections.Counter[str] = collections.Counter()
    sent = 0
    deadline = time.monotonic() + minutes * 60
    kills = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            kind = rng.choices(names, weights)[0]
            sent += 1
            results[await one(session, base, kind, timeout)] += 1

    async def killer(session: aiohttp.ClientSession) -> None:
        nonlocal kills
        while time.monotonic() < deadline - kill_every:
            await asyncio.sleep(kill_every)
            async with session.get(f"{mgmt}/models/sleep") as resp:
                workers = (await resp.json())[0]["workers"]
            pids = [w["pid"] for w in workers if w["pid"] > 0 and w["status"] == "READY"]
            if pids:
                try:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass

    async def progress() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(15)
            left = max(0.0, deadline - time.monotonic())
            print(f"  {sent} sent, {sum(results.values())} answered, {kills} kills, {left:.0f} s left", flush=True)

    connector = aiohttp.TCPConnector(limit=clients * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)), killer(session), progress())
    results["_sent"] = sent
    results["_kills"] = kills
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between worker kills")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout: no answer by then = hung")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        sleep_archive(store, batch_ms=5, item_ms=1, model_config={"batchSize": 4, "maxBatchDelay": 5})
        props = {
            "disable_token_authorization": "true",
            "max_request_size": "10000",
            "default_workers_per_model": "2",
            "default_response_timeout": "30",
        }
        with EmbeddedServer(store, {"sleep": "sleep.mar"}, props) as server:
            results = asyncio.run(
                soak(
                    server.inference_url,
                    server.management_url,
                    args.minutes,
                    args.clients,
                    args.kill_every,
                    args.timeout,
                )
            )
    sent, kills = results.pop("_sent"), results.pop("_kills")
    answered = sum(v for k, v in results.items() if k.isdigit())
    print(f"sent {sent}, answered {answered}, worker kills {kills}")
    print("by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(results.items()) if k.isdigit()))
    print(f"hung {results['hung']} (must be 0), lost {results['lost']} (must be 0)")
    ok = results["hung"] == 0 and results["lost"] == 0 and answered == sent
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
