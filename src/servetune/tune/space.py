"""The search space: every config of every family, in an order that is cheap to walk, and their neighbours."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from servetune.tune.study import Config, Family, Study


def nearest(values: tuple[int, ...], target: int) -> int:
    """The value of ``values`` (sorted) closest to ``target``; the smaller one on a tie."""
    i = bisect.bisect_left(values, target)
    candidates = values[max(0, i - 1) : i + 1]
    return min(candidates, key=lambda value: (abs(value - target), value))


class Space:
    def __init__(self, study: Study) -> None:
        self.study = study
        self.families = study.families
        self._by_label = {f.label: f for f in self.families}

    def family(self, config: Config) -> Family:
        return self.study.family(config.family)

    def __contains__(self, config: Config) -> bool:
        family = self._by_label.get(config.family)
        return (
            family is not None
            and config.workers in family.workers
            and config.batch_size in family.batch_sizes
            and config.batch_delay_ms in family.batch_delays_ms
        )

    def __len__(self) -> int:
        return sum(f.size for f in self.families)

    def configs(self) -> list[Config]:
        """Every config, grouped so that consecutive ones differ in workers only where possible (family, delay,
        batch size, then workers ascending): the runner then re-registers the model only when it must."""
        return [
            Config(f.label, w, b, d)
            for f in self.families
            for d in f.batch_delays_ms
            for b in f.batch_sizes
            for w in f.workers
        ]

    def project(self, config: Config, family: Family) -> Config:
        """The config of ``family`` with knobs nearest to ``config``'s."""
        return Config(
            family.label,
            nearest(family.workers, config.workers),
            nearest(family.batch_sizes, config.batch_size),
            nearest(family.batch_delays_ms, config.batch_delay_ms),
        )

    def index(self, config: Config, axis: str) -> int:
        """The position of ``config``'s value along ``axis`` among its family's values."""
        family = self.family(config)
        values = {"workers": family.workers, "batch_size": family.batch_sizes, "batch_delay_ms": family.batch_delays_ms}
        return values[axis].index(getattr(config, axis))

    def step(self, config: Config, axis: str, delta: int) -> Config | None:
        """The config ``delta`` places along ``axis`` (workers, batch_size, batch_delay_ms), or None off the edge."""
        family = self.family(config)
        values = {
            "workers": family.workers,
            "batch_size": family.batch_sizes,
            "batch_delay_ms": family.batch_delays_ms,
        }[axis]
        i = values.index(getattr(config, axis)) + delta
        if not 0 <= i < len(values):
            return None
        knobs = {"workers": config.workers, "batch_size": config.batch_size, "batch_delay_ms": config.batch_delay_ms}
        knobs[axis] = values[i]
        return Config(config.family, **knobs)

    def neighbours(self, config: Config) -> list[Config]:
        """One step along each knob, the two anti-diagonals (more workers with a smaller batch, and the reverse,
        which follow an SLA boundary), and the same knobs in every other family."""
        out: list[Config | None] = []
        for axis in ("batch_size", "workers", "batch_delay_ms"):
            for delta in (-1, 1):
                out.append(self.step(config, axis, delta))
        for dw, db in ((1, -1), (-1, 1)):
            moved = self.step(config, "workers", dw)
            out.append(None if moved is None else self.step(moved, "batch_size", db))
        out += [self.project(config, f) for f in self.families if f.label != config.family]
        return unique(c for c in out if c is not None)


def unique(configs: Iterable[Config]) -> list[Config]:
    return list(dict.fromkeys(configs))


def cheap_order(configs: Iterable[Config]) -> list[Config]:
    """Sorted so that configs needing the same registration (family, delay, batch) run together, workers rising."""
    return sorted(configs, key=lambda c: (c.family, c.batch_delay_ms, c.batch_size, c.workers))
