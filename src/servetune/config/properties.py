"""Reader for Java ``.properties`` files, the format of TorchServe's ``config.properties``."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from servetune._exceptions import ConfigError

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_ENV_REF = re.compile(r"\$\$([A-Za-z_][A-Za-z0-9_]*)\$\$")


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                try:
                    out.append(chr(int(text[i + 2 : i + 6], 16)))
                    i += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        # A line ending in an odd number of backslashes continues on the next line.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def _substitute(match: re.Match[str], *, key: str, source: str) -> str:
    name = match.group(1)
    if name not in os.environ:
        raise ConfigError(f"{source}: {key} refers to environment variable {name}, which is not set")
    return os.environ[name]


def parse_properties(text: str, *, source: str = "<string>") -> dict[str, str]:
    """Parse ``key=value`` / ``key: value`` / ``key value`` lines; ``$$VAR$$`` is replaced from the environment."""
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        match = re.match(r"((?:\\.|[^=:\s\\])+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            key, value = line, ""
        else:
            key, value = match.group(1), match.group(2)
        key, value = _unescape(key), _unescape(value).strip()

        result[key] = _ENV_REF.sub(functools.partial(_substitute, key=key, source=source), value)
    return result


def read_properties(path: Path) -> dict[str, str]:
    """Read a ``config.properties`` file; a missing or unreadable file is a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    return parse_properties(text, source=str(path))
