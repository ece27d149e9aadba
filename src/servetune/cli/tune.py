"""``servetune tune STUDY.yaml``: find the deployment with the most throughput under a latency SLA."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from servetune.tune._values import duration

if TYPE_CHECKING:
    from servetune.tune.study import Study


@click.command("tune", context_settings={"show_default": True})
@click.argument("study_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--sla-p99",
    help="P99 latency limit in ms, or a multiple of this machine's single-request latency (3x, measured first); "
    "sets or overrides the study's SLA.",
)
@click.option("--budget", help="Start no trial that would end after this long (90s, 20m, 1h30m).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Study folder for the checkpoint, reports and deploy files. [default: <study>-tune/ beside the study]",
)
@click.option("--strategy", type=click.Choice(["adaptive", "grid"]), help="Override the study's search strategy.")
@click.option(
    "--backend",
    type=click.Choice(["native", "ray"]),
    help="The server trials run on: servetune's own, or Ray Serve (servetune[ray]). [default: the study's]",
)
@click.option(
    "--ray-address",
    metavar="HOST:PORT",
    help="With backend ray: a running Ray cluster's head (or auto). [default: the study's, else a private local one]",
)
@click.option(
    "--protocol",
    type=click.Choice(["torchserve", "kserve-v1", "v2-json", "v2-binary", "v2-grpc", "torchserve-grpc"]),
    help="How trials call the model, as its real callers will: TorchServe's API, KServe v1, OIP v2 (JSON, binary, "
    "gRPC) or TorchServe's gRPC. [default: the study's load.protocol, else torchserve]",
)
@click.option("--url", help="Tune this running server (its inference address) instead of starting one.")
@click.option("--management-url", help="With --url: the management address. [default: inference port + 1]")
@click.option(
    "--metrics-url",
    help="With --url: the metrics API (e.g. http://HOST:8082/metrics), for TorchServe servers' time breakdown.",
)
@click.option(
    "--key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --url: the server's key_file.json, when token authorization is on.",
)
def command(
    study_file: Path,
    sla_p99: str | None,
    budget: str | None,
    out: Path | None,
    strategy: str | None,
    backend: str | None,
    ray_address: str | None,
    protocol: str | None,
    url: str | None,
    management_url: str | None,
    metrics_url: str | None,
    key_file: Path | None,
) -> None:
    """Search optimization x device x workers x batch size x batch delay for the config with the most
    throughput (or the lowest cost) inside a latency SLA, and write it out ready to serve.

    STUDY_FILE is servetune's study format or TorchServe's auto-benchmark model config (benchmarks/models_config).
    Re-running the same study resumes it. Exit status: 0 when a config meets the SLA; 3 when none does on this
    hardware (the report names the closest); 2 for an invalid study; 130 when interrupted.
    """
    from rich.console import Console

    from servetune.tune import Remote, load_study, override, tune
    from servetune.tune.report import describe, finalist_lines, headline, online_lines
    from servetune.tune.targets import prepare

    console = Console(stderr=True)
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: the server is stopped, the report written
    budget_s = duration("--budget", budget) if budget is not None else None
    study = override(
        load_study(study_file),
        sla_p99_ms=_sla(sla_p99),
        budget_s=budget_s,
        strategy=strategy,
        backend=backend,
        address=ray_address,
        protocol=protocol,
    )
    out = out or study_file.with_name(f"{study_file.stem}-tune")
    remote = Remote(url, management_url, metrics_url, key_file) if url else None
    if remote is None:
        study = prepare(study)  # the space as it is searched (Ray adds a knob), for the line below
    console.print(
        f"tuning {study.model}: {study.size} configs, {describe_sla(study)}, strategy {study.strategy.name}, "
        f"budget {study.budget.describe()}{on_ray(study, remote is not None)} -> {out}",
        highlight=False,
    )
    result = tune(study, out, remote=remote, console=console)
    analysis = result.analysis
    click.echo(headline(analysis, result.study))
    for line in (*finalist_lines(analysis, result.study), *online_lines(analysis, result.study)):
        click.echo(line)
    if analysis.winner is not None and result.deployment is not None:
        click.echo(f"winner: {describe(analysis.winner.config, result.study)}")
        click.echo(f"serve it: {result.deployment.serve_command}")
    click.echo(
        f"{len(result.trials)} trials ({result.measured} measured now, {result.resumed} from the checkpoint); "
        f"report: {result.report}"
    )
    if result.stopped == "interrupted":
        sys.exit(130)
    if analysis.winner is None:
        sys.exit(NO_CONFIG_MEETS_THE_SLA)


NO_CONFIG_MEETS_THE_SLA = 3  # documented in docs/tune.md; 1 stays Python's status for a crash


def _sla(value: str | None) -> float | str | None:
    """``--sla-p99``: milliseconds, or a multiple of the single-request latency (``3x``)."""
    if value is None or value.strip().lower().endswith("x"):
        return value
    try:
        return float(value)
    except ValueError:
        from servetune._exceptions import ConfigError

        raise ConfigError(f"--sla-p99={value!r}: expected milliseconds (1000) or a multiple such as 3x") from None


def describe_sla(study: Study) -> str:
    """The SLA as given: limits in ms, and those sized on this machine (measured before the first trial)."""
    relative = [f"{key.removesuffix('_ms').upper()} <= {multiple:g}x the single-request latency"
                for key, multiple in study.sla_scale]  # fmt: skip
    if not relative:
        return study.sla.describe()
    fixed = "" if study.sla.empty else f", {study.sla.describe()}"
    return " and ".join(relative) + " (measured first)" + fixed


def on_ray(study: Study, remote: bool) -> str:
    if study.backend != "ray" or remote:
        return ""
    return f", on Ray ({study.backend_address or 'a local Ray instance'})"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
