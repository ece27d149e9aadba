"""Variants chosen by name (STYLE.md habit 3): each kind keeps a registry, a mapping of name -> ``"module:attr"``
(strategies, targets, model variants, load engines, pipeline hooks, CLI subcommands), and loads the one it is asked
for with :func:`registered`, so that a variant's module (and what it imports: torch, grpc, Ray) is imported only
when that variant is used.

A handler named in a manifest is not looked up here: TorchServe's rules decide what ``model.handler`` means
(``servetune.handlers.loader``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from servetune._exceptions import ConfigError


def load_target(target: str) -> Any:
    """The object at ``"module:attr"``, its module imported now."""
    module_name, sep, attr = target.partition(":")
    if not (module_name and sep and attr):
        raise ValueError(f"registry entry {target!r}: expected 'module:attr'")
    return getattr(importlib.import_module(module_name), attr)


def registered(registry: Mapping[str, str], name: str, unknown: str) -> Any:
    """The object registered under ``name``; ConfigError(``unknown``) when no entry has that name (``unknown``
    names the setting and what was expected, as every ConfigError does)."""
    target = registry.get(name)
    if target is None:
        raise ConfigError(unknown)
    return load_target(target)


__all__ = ["load_target", "registered"]
