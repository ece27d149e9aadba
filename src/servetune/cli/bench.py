"""``servetune bench URL``: put load on a prediction endpoint and report throughput and latency honestly."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from servetune._exceptions import ConfigError
from servetune.bench import ENGINES, BenchSpec, StageSpec, parse_stages, parse_warmup, run_bench
from servetune.bench.report import print_summary, write_report


def _pairs(values: tuple[str, ...], sep: str, option: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        key, found, rest = value.partition(sep)
        if not found or not key.strip():
            raise ConfigError(f"{option}={value!r}: expected KEY{sep}VALUE")
        pairs.append((key.strip(), rest.strip()))
    return pairs


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
    type=click.Choice(["constant", "poisson"]),
    default="constant",
    help="Open loop: evenly spaced sends, or a Poisson process.",
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
@click.option("--seed", type=int, default=0, help="Seed of the Poisson arrivals.")
@click.option("--label", "labels", multiple=True, help="key=value written to the report, e.g. batch_size=4.")
@click.option(
    "--output",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write result.json, ab_report.csv, report.md, samples.csv and latency.png here.",
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
    call graph (URL: the inference address), reported end to end and per stage."""
    warmup_requests, warmup_seconds = parse_warmup(warmup)
    spec = BenchSpec(
        url=url,
        input=input_path,
        content_type=content_type,
        form_field=form_field,
        method=method.upper(),
        headers=tuple(_pairs(headers, ":", "--header")),
        concurrency=concurrency,
        rate=rate,
        arrival="poisson" if arrival == "poisson" else "constant",
        requests=requests if requests is not None or duration is not None else 100,
        duration=duration,
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
