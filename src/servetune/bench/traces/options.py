"""An importer's options (``--trace-opt KEY=VALUE``, or a study's ``load.trace_options``), read with their types.

Values come as strings from the command line and as YAML values from a study; each read names the key and what was
expected, and a key no importer read is refused (a typo must not silently change the load).
"""

from __future__ import annotations

import math
from typing import Any

from servetune._exceptions import ConfigError


class TraceOptions:
    def __init__(self, source: str, values: dict[str, Any]) -> None:
        self.source = source
        self.values = values
        self.used: set[str] = set()

    def _fail(self, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"trace {self.source!r}: option {key}={value!r}: expected {expected}")

    def text(self, key: str, default: str | None = None) -> str | None:
        self.used.add(key)
        value = self.values.get(key, default)
        if value is None:
            return None
        if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
            raise self._fail(key, value, "a non-empty string")
        return str(value).strip()

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.text(key, default)
        if value not in choices:
            raise self._fail(key, value, f"one of {', '.join(choices)}")
        return value

    def number(self, key: str, default: float, minimum: float = 0.0) -> float:
        self.used.add(key)
        value = self.values.get(key, default)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise self._fail(key, value, "a number") from None
        if isinstance(value, bool) or not math.isfinite(number) or number <= minimum:
            raise self._fail(key, value, f"a number > {minimum:g}")
        return number

    def integer(self, key: str, default: int, minimum: int = 1) -> int:
        self.used.add(key)
        value = self.values.get(key, default)
        try:
            number = int(str(value))
        except ValueError:
            raise self._fail(key, value, f"a whole number >= {minimum}") from None
        if isinstance(value, bool) or number < minimum:
            raise self._fail(key, value, f"a whole number >= {minimum}")
        return number

    def check_used(self) -> None:
        unknown = sorted(set(self.values) - self.used)
        if unknown:
            known = ", ".join(sorted(self.used))
            raise ConfigError(f"trace {self.source!r}: option {unknown[0]!r} is not one this format reads ({known})")
