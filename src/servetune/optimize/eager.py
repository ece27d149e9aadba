"""``eager``: the model as it is, fp32. The baseline every other variant is measured and checked against."""

from __future__ import annotations

from servetune.optimize.base import Stage, Variant
from servetune.optimize.parity import Tolerance


class Eager(Variant):
    name = "eager"
    kind = "baseline"
    tolerance = Tolerance(atol=1e-6, rtol=1e-6)

    def apply(self, stage: Stage) -> None:
        """Nothing to convert: the stage's module is the source model itself."""
