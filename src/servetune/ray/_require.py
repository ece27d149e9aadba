"""Ray is optional: import it here, or say how to install it."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from servetune._exceptions import ConfigError

INSTALL_HINT = (
    "the Ray backend needs Ray Serve, which is not installed: pip install 'servetune[ray]' "
    "(or pip install 'ray[serve]')"
)


def ray_available() -> bool:
    """True when ``ray.serve`` can be imported."""
    try:
        require_ray()
    except ConfigError:
        return False
    return True


def require_ray() -> ModuleType:
    """Return the ``ray`` module with ``ray.serve`` loaded; raise ConfigError with the install command if absent."""
    try:
        with warnings.catch_warnings():  # Ray's modules use pydantic features deprecated in 2.x as they load
            warnings.simplefilter("ignore", DeprecationWarning)
            importlib.import_module("ray.serve")
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None
    return importlib.import_module("ray")
