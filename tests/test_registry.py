"""The one name -> ``"module:attr"`` loader (servetune.registry) and every registry built on it."""

from __future__ import annotations

import pytest

from servetune._exceptions import ConfigError
from servetune.bench.engines import ENGINES
from servetune.bench.hooks import HOOKS
from servetune.cli import SUBCOMMANDS
from servetune.optimize.registry import VARIANTS
from servetune.registry import load_target, registered
from servetune.tune.strategies import STRATEGIES
from servetune.tune.targets import TARGETS

REGISTRIES = {
    "engines": ENGINES,
    "hooks": HOOKS,
    "subcommands": SUBCOMMANDS,
    "variants": VARIANTS,
    "strategies": STRATEGIES,
    "targets": TARGETS,
}


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_every_registered_name_loads(kind: str) -> None:
    """A misspelt module or attribute in a registry fails here, not when a user first picks that name."""
    for name in REGISTRIES[kind]:
        assert callable(registered(REGISTRIES[kind], name, "unused")), name  # a class, a function, a click command


def test_an_unknown_name_is_the_callers_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^engine='x': expected one of"):
        registered(ENGINES, "x", "engine='x': expected one of " + ", ".join(ENGINES))


@pytest.mark.parametrize("target", ["servetune.registry", "servetune.registry:", ":load_target"])
def test_a_malformed_entry_says_what_was_expected(target: str) -> None:
    with pytest.raises(ValueError, match="expected 'module:attr'"):
        load_target(target)
