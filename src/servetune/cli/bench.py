"""``servetune bench URL``: put load on a prediction endpoint and report throughput and latency honestly."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from servetune._exceptions import ConfigError
from servetune.bench import ENGINES, BenchSpec, StageSpec, parse_stages, parse_warmup, run_bench
from servetune.bench.report import print_summary, write_report
from servetune.bench.schedule import Schedule
from servetune.bench.slo import parse_slo
from servetune.bench.traces import TRACE_FORMATS, read_trace


def _pairs(values: tuple[str, ...], sep: str, option: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        key, found, rest = value.partition(sep)
        if not found or not key.strip():
            raise ConfigError(f"{option}={value!r}: expected KEY{sep}VALUE")
        pairs.append((key.strip(), rest.strip()))
    return pairs


def trace_schedule(
    spec: BenchSpec,
    path: Path,
    trace_format: str | None,
    options: dict[str, str],
    time_scale: float,
    rate_scale: float,
    capacity_fraction: float | None,
) -> Schedule:
    """The trace's schedule, scaled in time, then in rate, then (shape mode) to a fraction of the measured capacity;
    what was done is said on stderr."""
    schedule = read_trace(path, trace_format, options)
    if time_scale != 1.0:
        schedule = schedule.time_scaled(time_scale)
    if rate_scale != 1.0:
        schedule = schedule.rate_scaled(rate_scale, spec.seed)
    if capacity_fraction is not None:
        from servetune.bench.fit import fit, measure_capacity

        capacity = measure_capacity(spec)
        click.echo(f"capacity of this server: {capacity.describe()}", err=True)
        schedule = fit(schedule, capacity.rps, capacity_fraction, spec.seed)
    for note in schedule.notes:
        click.echo(note, err=True)
    click.echo(
        f"trace {schedule.name}: {len(schedule)} requests over {schedule.duration_s:.1f} s "
        f"(mean {schedule.mean_rps:.1f} req/s, peak {schedule.peak_rps():.1f} req/s)",
        err=True,
    )
    return schedule


def read_pipeline(path: Path) -> tuple[StageSpec, ...]:
    """The stages of ``--pipeline FILE``: a YAML list, or a mapping (a study) with a ``pipeline`` key."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--pipeline={str(path)!r}: cannot read it: {exc}") from None
    if isinstance(raw, dict):
        if "pipeline" not in raw:
            raise ConfigError(f"--pipeline={str(path)!r}: expected a list of stages or a 'pipeline:' key")
        return parse_stages("pipeline", raw["pipeline"])
    return parse_stages("pipeline", raw)


@click.command(context_settings={"show_default": True})
@click.argument("url")
@click.option(
    "--input",
    "-i",
    "input_path",
    type=click.Path(exists=True, path_type=Path),
    help="Request body: a file, or a directory of files sent in turn. Empty body if not given.",
)
@click.option("--content-type", "-T", help="Content type of the input (guessed from the file name if not given).")
@click.option("--form-field", help="Send each file as this multipart/form-data field (e.g. data) instead of raw.")
@click.option(
    "--method", type=click.Choice(["POST", "PUT", "GET"], case_sensitive=False), default="POST", help="HTTP method."
)
@click.option("--header", "-H", "headers", multiple=True, help="Extra request header 'Name: value' (repeatable).")
@click.option("--concurrency", "-c", type=int, help="Closed loop: clients, each waiting for its answer. [default: 1]")
@click.option("--rate", "-r", type=float, help="Open loop: requests per second on a fixed schedule.")
@click.option(
    "--arrival",
    type=click.Choice(["constant", "poisson", "gamma"]),
    default="constant",
    help="Open loop: evenly spaced sends, a Poisson process, or Gamma gaps (burstier with --cv > 1).",
)
@click.option("--cv", type=float, default=1.0, help="--arrival gamma: coefficient of variation of the gaps.")
@click.option(
    "--trace",
    "trace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Open loop: replay this trace (or synthetic shape, .yaml); its format is told from the file, or by "
    "--trace-format. docs/bench.md lists the formats.",
)
@click.option("--trace-format", type=click.Choice(list(TRACE_FORMATS)), help="The trace's format, when not told.")
@click.option(
    "--trace-opt",
    "trace_opts",
    multiple=True,
    help="KEY=VALUE read by the trace's importer (repeatable), e.g. function=HASH, arrival=gamma, cv=2, seed=1.",
)
@click.option("--time-scale", type=float, default=1.0, help="Multiply the trace's times (0.01: a day in 14.4 min).")
@click.option(
    "--rate-scale", type=float, default=1.0, help="Multiply the trace's rate, keeping its curve (seeded by --seed)."
)
@click.option(
    "--capacity-fraction",
    type=float,
    help="Shape mode: measure this server's capacity first, then scale the trace's peak rate to this fraction of "
    "it (0.8), keeping its curve.",
)
@click.option(
    "--slo",
    "slo",
    multiple=True,
    help="KEY=VALUE (repeatable): p99_ms, p95_ms, mean_ms, max_error_rate. Reports goodput, attainment and windows.",
)
@click.option("--window", type=float, default=10.0, help="Window (s) of the time series against the SLO.")
@click.option(
    "--server-pid",
    "server_pids",
    type=int,
    multiple=True,
    help="The server's process (repeatable; with its children): its CPU is not interference. [default: the "
    "process listening on the URL's port, when on this machine]",
)
@click.option("--requests", "-n", type=int, help="Measured requests (100 if neither this nor --duration is given).")
@click.option("--duration", "-d", type=float, help="Measured seconds (with --requests: whichever ends first).")
@click.option("--warmup", "-w", default="0", help="Warm-up excluded from results: requests (100) or seconds (5s).")
@click.option("--timeout", type=float, default=60.0, help="Per-request timeout in seconds.")
@click.option(
    "--engine",
    "-e",
    type=click.Choice(sorted(ENGINES)),
    default="async",
    help="async: built-in (open or closed loop); ab: Apache Bench (closed loop, as TorchServe runs it).",
)
@click.option(
    "--metrics-url",
    help="Server metrics address (e.g. http://127.0.0.1:8082): breakdown from "
    "/metrics deltas when the responses carry no X-Servetune-* timing headers.",
)
@click.option(
    "--management-url",
    help="Management address (e.g. http://127.0.0.1:8081): fills batch size, "
    "batch delay and workers into the report from GET /models/{model}.",
)
@click.option(
    "--management-token",
    help="Bearer key for --management-url when token auth is on (the 'management' key of key_file.json); "
    "or set SERVETUNE_MANAGEMENT_TOKEN.",
)
@click.option("--max-connections", type=int, default=1024, help="Open loop: most connections open at once.")
@click.option("--seed", type=int, default=0, help="Seed of the Poisson/Gamma arrivals and of --rate-scale.")
@click.option("--label", "labels", multiple=True, help="key=value written to the report, e.g. batch_size=4.")
@click.option(
    "--output",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write result.json, ab_report.csv, report.md, samples.csv, requests.jsonl, windows.csv (with --slo) and "
    "latency.png here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print result.json to stdout instead of the summary.")
@click.option(
    "--pipeline",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Drive an app's pipeline instead of one endpoint: a YAML list of stages, or a study with a 'pipeline:' "
    "key. URL is then the inference address (http://HOST:8080); --input goes to the first stage.",
)
def command(
    url: str,
    input_path: Path | None,
    content_type: str | None,
    form_field: str | None,
    method: str,
    headers: tuple[str, ...],
    concurrency: int | None,
    rate: float | None,
    arrival: str,
    cv: float,
    trace: Path | None,
    trace_format: str | None,
    trace_opts: tuple[str, ...],
    time_scale: float,
    rate_scale: float,
    capacity_fraction: float | None,
    slo: tuple[str, ...],
    window: float,
    server_pids: tuple[int, ...],
    requests: int | None,
    duration: float | None,
    warmup: str,
    timeout: float,
    engine: str,
    metrics_url: str | None,
    management_url: str | None,
    management_token: str | None,
    max_connections: int,
    seed: int,
    labels: tuple[str, ...],
    output: Path | None,
    as_json: bool,
    pipeline: Path | None,
) -> None:
    """Put load on URL (e.g. http://127.0.0.1:8080/predictions/resnet-18) and report throughput, errors,
    latency percentiles and the server's queue/handler breakdown. With --pipeline, each request is an app's whole
    call graph (URL: the inference address), reported end to end and per stage. With --trace, requests leave when
    the trace says; with --slo, goodput, attainment and the SLO per window are reported."""
    warmup_requests, warmup_seconds = parse_warmup(warmup)
    if trace is None and (trace_format or trace_opts or capacity_fraction is not None):
        raise ConfigError("--trace-format, --trace-opt and --capacity-fraction apply to a --trace")
    if trace is not None and (rate is not None or concurrency is not None):
        raise ConfigError("--trace with --rate or --concurrency: a trace says when each request leaves; give one")
    common = dict(
        url=url,
        input=input_path,
        content_type=content_type,
        form_field=form_field,
        method=method.upper(),
        headers=tuple(_pairs(headers, ":", "--header")),
        arrival="poisson" if arrival == "poisson" else "gamma" if arrival == "gamma" else "constant",
        cv=cv,
        warmup_requests=warmup_requests,
        warmup_seconds=warmup_seconds,
        timeout=timeout,
        engine=engine,
        metrics_url=metrics_url,
        management_url=management_url,
        management_token=management_token or os.environ.get("SERVETUNE_MANAGEMENT_TOKEN"),
        max_connections=max_connections,
        seed=seed,
        labels=dict(_pairs(labels, "=", "--label")),
        stages=read_pipeline(pipeline) if pipeline is not None else (),
        hook_dir=pipeline.parent.resolve() if pipeline is not None else None,
        slo=parse_slo(slo),
        window_s=window,
        server_pids=server_pids,
    )
    schedule = None
    if trace is not None:
        probe = BenchSpec(**common, concurrency=1, duration=1.0)  # type: ignore[arg-type]
        schedule = trace_schedule(probe, trace, trace_format, dict(_pairs(trace_opts, "=", "--trace-opt")),
                                  time_scale, rate_scale, capacity_fraction)  # fmt: skip
    spec = BenchSpec(
        **common,  # type: ignore[arg-type]
        concurrency=concurrency,
        rate=rate,
        requests=requests if requests is not None or duration is not None or trace is not None else 100,
        duration=duration,
        schedule=schedule,
    )
    result = run_bench(spec, progress=True)
    if as_json:
        click.echo(result.to_json())
    else:
        print_summary(result)
    if output is not None:
        for path in write_report(result, output):
            click.echo(f"wrote {path}", err=as_json)
    sys.stdout.flush()
