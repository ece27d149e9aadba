"""Write the sample traces of this folder (deterministic: run it again and nothing changes).

Every file is written by the project in a public trace format (docs/bench.md, "Traces"); the hashes and counts are
made up. ``intervals.txt`` holds perf_analyzer's documented example, ``azure-functions-2021.csv`` the six example rows
of the Azure Functions 2021 trace's description.

    python examples/traces/make_samples.py
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fake_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def step_csv() -> None:
    """servetune's own schema: a 2.5x step, 5 s at 20 req/s then 5 s at 50 req/s, evenly spaced."""
    rows = ["t_ms,size"]
    rows += [f"{i * 50},1" for i in range(100)]
    rows += [f"{5000 + i * 20},1" for i in range(250)]
    (HERE / "step.csv").write_text("\n".join(rows) + "\n")


def azure_2019() -> None:
    """Three functions of one app, a day of per-minute counts: an HTTP function on a daily curve, a timer firing 12
    times a minute, and a queue function with bursts."""
    rng = random.Random(2019)
    owner, app = fake_hash("owner"), fake_hash("app")
    header = ["HashOwner", "HashApp", "HashFunction", "Trigger"] + [str(m) for m in range(1, 1441)]
    lines = [",".join(header)]
    http = [round(20 + 60 * (1 - math.cos(2 * math.pi * m / 1440)) / 2 + rng.gauss(0, 4)) for m in range(1440)]
    timer = [12] * 1440
    queue = [rng.choice([0, 0, 0, 1, 2]) + (rng.randint(80, 160) if rng.random() < 0.02 else 0) for m in range(1440)]
    for name, trigger, counts in (("http", "http", http), ("timer", "timer", timer), ("queue", "queue", queue)):
        lines.append(",".join([owner, app, fake_hash(name), trigger] + [str(max(0, c)) for c in counts]))
    (HERE / "azure-functions-2019.csv").write_text("\n".join(lines) + "\n")


AZURE_2021_EXAMPLE = """app,func,end_timestamp,duration
734272c01926d19690e5ec308bab64ef97950b75b1c7582283e0783fce1751d8,313c03f53a0d31f70aec25f62efb33e7dd779725ca4af579018452d1204beaad,5160.142570018768,0.134
17c37a0fdd5d1932b755c0e6447137bc08fd524f455e14fdac414f584de08dc5,c9f8e30e36d1aef62c10b3cfca6e289a93848a148d876dd514753040314f4817,5161.280997037888,0.013
7fa05b607ae861b85ec53cea12d3efaed8be0f9a92f5d6e8067244161d491e96,9bc86d6cd1ee254aaa313492f0fd88be8bd7b92d50d4237ff52d7685440c0906,5241.567729949951,42.356
c8c43e1a911f29e5506460a2fbef61ff39723d672f3b3b67d12d4c236c6872f7,653cdbc309bc359f3289d3b4df21c4a8e478d22946b35cbfdab05377dcacd3e0,5253.883348941803,42.372
db6be4a997f386b37c6246aaeecf81ab81562db84cf4c0d44907d9df2d0ab9fc,9040b71f8a0325ba418c85bcefa3b19c02c781bed6284af487d3f111f369534a,5219.518173933029,0.108
f7bfe5bc8d2a37a5c15986fbfc2c477a746e866adcb9663f9df7535b61c3eb9b,34f4775366e51728635af48df1a96d332cf1565eee069a0030f12966ae760274,5220.1072909832,0.093
"""


def burstgpt() -> None:
    """BurstGPT's columns: a minute of made-up requests with a burst at 20-25 s."""
    rng = random.Random(7)
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    t = 0.0
    while t < 60.0:
        t += rng.expovariate(8.0 if 20.0 <= t < 25.0 else 1.5)
        model = "ChatGPT" if rng.random() < 0.8 else "GPT-4"
        request, response = rng.randint(20, 2000), rng.choice([0] + [rng.randint(10, 600)] * 19)
        lines.append(f"{t:.0f},{model},{request},{response},{request + response},Conversation log")
    (HERE / "burstgpt.csv").write_text("\n".join(lines) + "\n")


def mooncake() -> None:
    """Mooncake's JSONL: timestamp (ms), input_length, output_length, hash_ids."""
    rng = random.Random(11)
    t, lines, block = 0, [], 0
    for _ in range(60):
        t += int(rng.expovariate(1 / 400.0))
        blocks = rng.randint(1, 6)
        ids = list(range(block, block + blocks))
        block += blocks
        size = blocks * 512 - rng.randint(0, 511)
        row = {"timestamp": t, "input_length": size, "output_length": rng.randint(10, 500), "hash_ids": ids}
        lines.append(json.dumps(row))
    (HERE / "mooncake.jsonl").write_text("\n".join(lines) + "\n")


def main() -> None:
    step_csv()
    azure_2019()
    (HERE / "azure-functions-2021.csv").write_text(AZURE_2021_EXAMPLE)
    burstgpt()
    mooncake()
    (HERE / "intervals.txt").write_text("100000\n200000\n500000\n")


if __name__ == "__main__":
    main()
