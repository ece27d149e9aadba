"""The ``servetune`` command: one click group, one module per subcommand, loaded lazily.

Subcommands live in ``servetune/cli/<name>.py`` and expose a click command called ``command``, registered by name
(``SUBCOMMANDS``: name -> ``"module:attr"``). Loading them lazily keeps ``servetune --help`` fast (no torch import).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import click

from servetune._exceptions import ServetuneError
from servetune.registry import load_target

# name -> "module:attr" of its click command
SUBCOMMANDS: dict[str, str] = {
    "archive": "servetune.cli.archive:command",
    "serve": "servetune.cli.serve:command",
    "bench": "servetune.cli.bench:command",
    "optimize": "servetune.cli.optimize:command",
    "tune": "servetune.cli.tune:command",
    "kserve": "servetune.cli.kserve:command",
}


def _present(target: str) -> bool:
    return importlib.util.find_spec(target.partition(":")[0]) is not None


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, target in SUBCOMMANDS.items() if _present(target))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None or not _present(target):
            return None
        command: click.Command = load_target(target)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="servetune")
def cli() -> None:
    """Serve PyTorch models the TorchServe way, measure them honestly, tune them to a latency SLA."""


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point: servetune errors print as one line and exit 2."""
    try:
        return cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ServetuneError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
