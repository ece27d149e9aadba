"""The ``servetune`` command: one click group, one module per subcommand, loaded lazily.

Subcommands live in ``servetune/cli/<name>.py`` and expose a click command called ``command``.
Loading them lazily keeps ``servetune --help`` fast (no torch import).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click

from servetune._exceptions import ServetuneError

# name -> module holding a click command called ``command``
SUBCOMMANDS: dict[str, str] = {
    "archive": "servetune.cli.archive",
    "serve": "servetune.cli.serve",
    "bench": "servetune.cli.bench",
    "optimize": "servetune.cli.optimize",
    "tune": "servetune.cli.tune",
    "kserve": "servetune.cli.kserve",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, mod in SUBCOMMANDS.items() if importlib.util.find_spec(mod) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = SUBCOMMANDS.get(cmd_name)
        if module_name is None or importlib.util.find_spec(module_name) is None:
            return None
        command: click.Command = importlib.import_module(module_name).command
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
