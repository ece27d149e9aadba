"""The exception tree.

ServetuneError
 ├── ConfigError     a setting, study or CLI value is invalid (names the key and the value)
 ├── ArchiveError    a model archive is unreadable, unsafe or malformed
 ├── HandlerError    a handler cannot be loaded or broke its contract
 ├── ModelError      a model registry operation failed (carries the HTTP status to answer with)
 ├── BenchError      a load run could not be carried out
 └── OptimizeError   a model variant could not be made or used
      ├── VariantNotApplicable   (servetune.optimize) the variant cannot apply; ``reason`` says why
      └── ParityError            (servetune.optimize) its answers differ from eager; ``report`` has the figures
"""

from __future__ import annotations


class ServetuneError(Exception):
    """Base class of every error servetune raises on purpose."""


class ConfigError(ServetuneError):
    """A configuration value is invalid."""


class ArchiveError(ServetuneError):
    """A model archive is unreadable, unsafe or malformed."""


class HandlerError(ServetuneError):
    """A handler cannot be loaded or broke the handler contract."""


class ModelError(ServetuneError):
    """A model registry operation failed; ``status`` and ``type`` become the HTTP error answer."""

    def __init__(self, message: str, status: int = 400, type: str = "BadRequestException") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type


class BenchError(ServetuneError):
    """A load run could not be carried out."""


class OptimizeError(ServetuneError):
    """A model variant could not be made or used."""
