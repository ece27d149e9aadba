"""Typed readers for study YAML values: every error names the key (as a dotted path), the value and what was wanted."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)\s*(h|m|s|ms)", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(?:\d+(?:\.\d*)?\s*(?:h|m|s|ms)\s*)+$", re.IGNORECASE)
_SCALE = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def fail(where: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{where}={value!r}: expected {expected}")


def mapping(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise fail(where, value, "a mapping of names to values")
    return value


def check_keys(where: str, value: Mapping[str, Any], known: Sequence[str]) -> None:
    """Reject any key not in ``known``, naming it and listing what is accepted."""
    for key in value:
        if key not in known:
            prefix = f"{where}." if where else ""
            raise ConfigError(f"{prefix}{key}: unknown key; expected one of {', '.join(known)}")


def integer(where: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(where, value, f"a whole number >= {minimum}")
    return value


def number(where: str, value: Any, minimum: float = 0.0, *, strict: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(where, value, "a number")
    if value < minimum or (strict and value == minimum):
        raise fail(where, value, f"a number {'>' if strict else '>='} {minimum:g}")
    return float(value)


def integers(where: str, value: Any, minimum: int = 1) -> tuple[int, ...]:
    """A list of whole numbers (a single number is a list of one), sorted, without duplicates."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise fail(where, value, "a non-empty list of whole numbers")
    return tuple(sorted({integer(f"{where}[{i}]", item, minimum) for i, item in enumerate(items)}))


def text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(where, value, "a non-empty string")
    return value.strip()


def texts(where: str, value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise fail(where, value, "a non-empty list of names")
    out: list[str] = []
    for i, item in enumerate(items):
        name = text(f"{where}[{i}]", item)
        if name not in out:
            out.append(name)
    return tuple(out)


def boolean(where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise fail(where, value, "true or false")


def duration(where: str, value: Any) -> float:
    """Seconds from ``90``, ``90s``, ``20m``, ``1h30m``, ``500ms`` (a bare number is seconds)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number(where, value)
    if isinstance(value, str) and re.fullmatch(r"\s*\d+(?:\.\d*)?\s*", value) and float(value) > 0:
        return float(value)
    if isinstance(value, str) and _DURATION.match(value):
        seconds = sum(float(n) * _SCALE[u.lower()] for n, u in _DURATION_PART.findall(value))
        if seconds > 0:
            return seconds
    raise fail(where, value, "a duration such as 90s, 20m or 1h30m")


def path(where: str, value: Any, base: Path, *, must_exist: bool = True) -> Path:
    """A filesystem path, relative to the study file's folder; ``file://`` URLs are accepted."""
    raw = text(where, value)
    if raw.startswith("file://"):
        raw = raw[len("file://") :]
    elif re.match(r"^[a-z][a-z0-9+.-]*://", raw, re.IGNORECASE):
        raise fail(where, value, "a local path or file:// URL (servetune tune does not download archives)")
    resolved = (base / Path(raw).expanduser()).resolve()
    if must_exist and not resolved.exists():
        raise ConfigError(f"{where}={value!r}: no such file or directory ({resolved})")
    return resolved
