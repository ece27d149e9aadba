"""``--engine ab``: Apache Bench, run the way TorchServe's benchmark-ab.py runs it, parsed into the same result.

TorchServe runs ``ab -c C -s 300 -n N -k -p INPUT -T CONTENT_TYPE URL`` (after a warm-up run of N/10). We add
``-g`` (one line per request: its total time, rounded to whole milliseconds) for the full sample set. Not ``-e``:
its percentile table reads past the end of ab's sample array at P99 in runs of 50 requests or fewer.
What ab cannot tell us, and how we treat it:
- it has no per-request status, so latency covers every answered request, failures included;
- it counts answers whose length differs from the first as "Length" failures; those are answers, not errors, so
  they are not counted as errors here (TorchServe's ab_report counts them);
- closed loop only: ab has no arrival schedule.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from servetune._exceptions import BenchError
from servetune.bench.engines import RunHooks
from servetune.bench.payload import Payload
from servetune.bench.progress import Progress
from servetune.bench.recording import UNKNOWN, Recording
from servetune.bench.spec import BenchSpec

# With -t and no -n, ab stops at 50,000 requests; give it room (its sample table costs ~60 bytes a request).
_DURATION_REQUESTS = 2_000_000
_COMPLETED = re.compile(r"Completed (\d+) requests")


def _field(text: str, pattern: str) -> str | None:
    match = re.search(pattern, text, re.MULTILINE)
    return match.group(1) if match else None


def parse_ab_output(text: str) -> dict[str, float]:
    """The figures of ab's text report: complete, failed (and its kinds), non_2xx, seconds, rps, mean_ms."""
    figures: dict[str, float] = {}
    for key, pattern in (
        ("complete", r"^Complete requests:\s+(\d+)"),
        ("failed", r"^Failed requests:\s+(\d+)"),
        ("non_2xx", r"^Non-2xx responses:\s+(\d+)"),
        ("seconds", r"^Time taken for tests:\s+([\d.]+) seconds"),
        ("rps", r"^Requests per second:\s+([\d.]+)"),
        ("mean_ms", r"^Time per request:\s+([\d.]+) \[ms\] \(mean\)$"),
    ):
        value = _field(text, pattern)
        if value is not None:
            figures[key] = float(value)
    kinds = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: (\d+), Exceptions: (\d+)\)", text)
    if kinds:
        for key, value in zip(("connect", "receive", "length", "exceptions"), kinds.groups(), strict=True):
            figures[key] = float(value)
    if "complete" not in figures or "seconds" not in figures:
        raise BenchError(f"cannot parse ab's report: {text[-400:]!r}")
    return figures


def parse_gnuplot(text: str) -> tuple[list[float], list[float]]:
    """ab ``-g`` rows -> (start seconds since the epoch, total ms) per request."""
    starts, totals = [], []
    for line in text.splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) >= 5:
            starts.append(float(cols[1]))
            totals.append(float(cols[4]))
    return starts, totals


class ApacheBenchEngine:
    """Runs the ``ab`` executable (Debian/Ubuntu: ``apt-get install apache2-utils``)."""

    name = "ab"

    def command(
        self, spec: BenchSpec, body: Path | None, content_type: str | None, out: Path, warmup: bool
    ) -> list[str]:
        cmd = ["ab", "-k", "-c", str(spec.clients), "-s", str(max(1, round(spec.timeout)))]
        requests, seconds = (spec.warmup_requests, spec.warmup_seconds) if warmup else (spec.requests, spec.duration)
        if seconds:
            cmd += ["-t", f"{seconds:g}", "-n", str(requests or _DURATION_REQUESTS)]
        else:  # ab refuses fewer requests than connections
            cmd += ["-n", str(max(requests or 1, spec.clients if warmup else 1))]
        if body is not None:
            cmd += ["-u" if spec.method.upper() == "PUT" else "-p", str(body), "-T", content_type or "text/plain"]
        for key, value in spec.headers:
            cmd += ["-H", f"{key}: {value}"]
        if not warmup:
            cmd += ["-g", str(out / "ab.tsv")]
        return [*cmd, spec.url]

    async def run(self, spec: BenchSpec, payloads: Sequence[Payload], hooks: RunHooks) -> Recording:
        if shutil.which("ab") is None:
            raise BenchError("engine 'ab' needs Apache Bench: apt-get install apache2-utils (or use --engine async)")
        if spec.mode == "open":
            raise BenchError(f"engine 'ab' is closed-loop only: rate={spec.rate} needs --engine async")
        if len(payloads) != 1:
            raise BenchError(f"engine 'ab' sends one body: input={str(spec.input)!r} holds {len(payloads)} files")
        if spec.clients > (spec.requests or spec.clients):
            raise BenchError(f"engine 'ab': concurrency={spec.clients} exceeds requests={spec.requests}")
        with tempfile.TemporaryDirectory(prefix="servetune-ab-") as tmp:
            out = Path(tmp)
            body = None
            if spec.method.upper() != "GET":
                body = out / "body"
                body.write_bytes(payloads[0].body)
            content_type = payloads[0].content_type
            if spec.warmup_requests or spec.warmup_seconds:
                hooks.progress.set_phase("warm-up")
                await self._execute(self.command(spec, body, content_type, out, warmup=True), hooks.progress)
            await hooks.measure_start()
            hooks.progress.set_phase("measuring")
            report, cpu = await self._execute(self.command(spec, body, content_type, out, warmup=False), hooks.progress)
            await hooks.measure_end()
            return self._recording(report, cpu, (out / "ab.tsv").read_text())

    def _recording(self, report: str, cpu: float, gnuplot: str) -> Recording:
        figures = parse_ab_output(report)
        starts, totals = parse_gnuplot(gnuplot)
        rec = Recording(window_s=figures["seconds"], cpu_seconds=cpu, resolution_ms=1.0)
        first = min(starts, default=0.0)
        for start, total in zip(starts, totals, strict=True):
            rec.add(start - first, total, UNKNOWN, float("nan"), float("nan"), 0)
        rec.peak_in_flight = 0
        errors: Counter[str] = Counter()
        for key, name in (
            ("non_2xx", "non-2xx"),
            ("connect", "connect"),
            ("receive", "receive"),
            ("exceptions", "exceptions"),
        ):
            if figures.get(key):
                errors[name] = int(figures[key])
        rec.extra_errors = errors
        if figures.get("length"):
            rec.warnings.append(
                f"ab counted {int(figures['length'])} 'Length' failures (answers whose size differs from the first); "
                "they are answers, not errors, and are not counted as errors here"
            )
        if errors:
            rec.warnings.append("ab cannot tell statuses apart: latency figures include the failed requests")
        return rec

    async def _execute(self, cmd: list[str], progress: Progress) -> tuple[str, float]:
        """Run ab; return its stdout and its own CPU seconds (wait4's rusage, so nothing else is counted)."""
        with tempfile.TemporaryFile() as stdout:
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
            try:
                status, cpu, stderr = await asyncio.to_thread(self._wait, proc, progress)
            except asyncio.CancelledError:
                proc.kill()
                raise
            stdout.seek(0)
            text = stdout.read().decode(errors="replace")
        if status != 0:
            raise BenchError(f"ab exited with {status}: {(stderr or text).strip()[-500:]}")
        return text, cpu

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], progress: Progress) -> tuple[int, float, str]:
        assert proc.stderr is not None
        lines = []
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            lines.append(line)
            match = _COMPLETED.search(line)
            if match:
                progress.done = int(match.group(1))
        proc.stderr.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode, usage.ru_utime + usage.ru_stime, "".join(lines)
