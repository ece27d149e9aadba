"""Errors of the optimize layer.

ServetuneError
 └── OptimizeError          a variant could not be made or used
      ├── VariantNotApplicable   the variant cannot apply to this model or device (``reason`` says why)
      └── ParityError            the variant's answers differ from eager beyond tolerance (``report`` has figures)

An unknown variant name or a bad combination is a :class:`~servetune.ConfigError`: it is wrong whatever the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servetune._exceptions import OptimizeError as OptimizeError

if TYPE_CHECKING:
    from servetune.optimize.parity import ParityReport


class VariantNotApplicable(OptimizeError):
    """The variant cannot apply to this model on this device; ``reason`` says why."""

    def __init__(self, variant: str, reason: str) -> None:
        super().__init__(f"variant {variant!r} does not apply: {reason}")
        self.variant = variant
        self.reason = reason


class ParityError(OptimizeError):
    """The variant's outputs differ from eager beyond tolerance; ``report`` carries the figures."""

    def __init__(self, report: ParityReport) -> None:
        super().__init__(f"variant {report.variant!r} fails parity with eager: {report.summary()}")
        self.report = report
