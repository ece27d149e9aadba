"""Read a ``model-config.yaml`` safely: what ``yaml.safe_load`` accepts either becomes plain JSON data (what a worker
or a Ray replica receives, as ``context.model_yaml_config``) or is refused with a :class:`ConfigError` naming the key.

Limits (docs/limits.md), fixed so that every reader of an archive (the server, Ray replicas, tune, optimize)
agrees on what loads:

- the file, and the config as JSON once YAML aliases are expanded, at most :data:`MAX_MODEL_CONFIG_BYTES`;
- at most :data:`MAX_YAML_ALIASES` aliases of lists or mappings, and nesting at most :data:`MAX_YAML_DEPTH` deep
  (SnakeYAML's defaults, which TorchServe's frontend reads the same file with): a "billion laughs" file is refused
  while it is parsed, before anything is expanded;
- values JSON cannot carry are refused by key, never converted behind the handler's back: dates and timestamps,
  ``!!binary``, ``!!set``, mapping keys that are not strings, a value that contains itself (a self-referencing anchor).
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import yaml

from servetune._exceptions import ConfigError

MAX_MODEL_CONFIG_BYTES = 64 * 1024
MAX_YAML_ALIASES = 50
MAX_YAML_DEPTH = 50

__all__ = ["MAX_MODEL_CONFIG_BYTES", "MAX_YAML_ALIASES", "MAX_YAML_DEPTH", "load_model_yaml"]


class _Refused(yaml.YAMLError):
    """A limit of this module, raised while the YAML is composed."""


class _LimitedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` counting aliases of collections and nesting depth as it composes, as SnakeYAML does."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.aliases = 0
        self.collection_aliases = 0
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            self.aliases += 1
            if isinstance(self.anchors.get(event.anchor), yaml.CollectionNode):
                self.collection_aliases += 1
                if self.collection_aliases > MAX_YAML_ALIASES:
                    raise _Refused(
                        f"more than {MAX_YAML_ALIASES} aliases of lists or mappings (line {event.start_mark.line + 1}):"
                        " YAML alias expansion is limited"
                    )
            return super().compose_node(parent, index)
        collection = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
        if collection:
            self.depth += 1
            if self.depth > MAX_YAML_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise _Refused(f"nested more than {MAX_YAML_DEPTH} levels deep (line {line})")
        try:
            return super().compose_node(parent, index)
        finally:
            if collection:
                self.depth -= 1


def load_model_yaml(raw: bytes, *, where: str) -> dict[str, Any]:
    """Parse a model-config.yaml (``where`` names it in errors) into plain JSON data; ``{}`` for an empty file."""
    if len(raw) > MAX_MODEL_CONFIG_BYTES:
        raise ConfigError(f"{where}: {len(raw)} bytes, more than the limit of {MAX_MODEL_CONFIG_BYTES} bytes")
    loader = _LimitedLoader(raw)
    try:
        data = loader.get_single_data()
    except _Refused as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError) as exc:
        # ValueError: values the constructor cannot build (``2024-13-45``, an integer of 5,000 digits)
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level, got {type(data).__name__}")
    plain = _Plain(where, aliased=loader.aliases > 0, size=len(raw))
    out = plain.value(data, "", set())
    assert isinstance(out, dict)
    return out


class _Plain:
    """One walk over the loaded data: a copy made of JSON types only, charged byte by byte (as JSON) against
    :data:`MAX_MODEL_CONFIG_BYTES`, so that expanding aliases costs at most that much work."""

    def __init__(self, where: str, *, aliased: bool, size: int) -> None:
        self.where = where
        self.left = MAX_MODEL_CONFIG_BYTES
        self.aliased = aliased
        self.size = size

    def refuse(self, path: str, why: str) -> ConfigError:
        return ConfigError(f"{self.where}: key {path or '(top level)'!r}: {why}")

    def charge(self, cost: int) -> None:
        self.left -= cost
        if self.left < 0:
            because = (
                f" (the file is {self.size} bytes; its YAML aliases repeat what they name)" if self.aliased else ""
            )
            raise ConfigError(
                f"{self.where}: expands to more than {MAX_MODEL_CONFIG_BYTES} bytes as JSON{because}; "
                "YAML alias expansion is limited"
            )

    def value(self, value: Any, path: str, active: set[int]) -> Any:
        if value is None or isinstance(value, bool):
            self.charge(5)
            return value
        if isinstance(value, int):
            self.charge(len(str(value)) + 1)
            return value
        if isinstance(value, float):
            self.charge(len(repr(value)) + 1 if math.isfinite(value) else 10)
            return value
        if isinstance(value, str):
            self.charge(len(json.dumps(value)) + 1)
            return value
        if isinstance(value, (datetime.date, datetime.datetime)):
            raise self.refuse(
                path, f"{value.isoformat()} is a YAML date, which cannot reach the handler; quote it to pass it as text"
            )
        if isinstance(value, bytes):
            raise self.refuse(path, "a !!binary value cannot reach the handler; write it as a base64 string")
        if isinstance(value, (set, frozenset)):
            raise self.refuse(path, "a !!set cannot reach the handler; write a list")
        if not isinstance(value, (dict, list, tuple)):
            raise self.refuse(path, f"a {type(value).__name__} value cannot reach the handler")
        if id(value) in active:
            raise self.refuse(path, "the value contains itself (a YAML anchor used inside its own value)")
        active.add(id(value))
        try:
            self.charge(2)
            if isinstance(value, dict):
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        where = f"under {path!r}" if path else "at the top level"
                        raise ConfigError(
                            f"{self.where}: key {key!r} {where}: mapping keys must be strings (quote the key)"
                        )
                    self.charge(len(json.dumps(key)) + 2)
                    out[key] = self.value(item, f"{path}.{key}" if path else key, active)
                return out
            return [self.value(item, f"{path}[{i}]", active) for i, item in enumerate(value)]
        finally:
            active.discard(id(value))
