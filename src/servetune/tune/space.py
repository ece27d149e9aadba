"""The search space: every config of every family, in an order that is cheap to walk, and their neighbours.

A point is one model's :class:`Config`, or, in an app study, an :class:`AppConfig` holding one config per model. Its
*axes* are ``(part, knob)`` pairs: the knobs (``KNOBS``) a part's family searches more than one value of. Strategies
walk points through this class only, so the same walk serves one model and an app.

An app's space is the product of its models' spaces, but a walk does not enumerate it: next to one-knob steps, a
*share* move gives one worker of one model to another (the cores an app has are split between its models, and the
best split is a dimension of its own: moving along it one knob at a time would pass through a worse point).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence

from servetune.tune.study import KNOBS, AppConfig, Config, Family, Point, Study

Axis = tuple[int, str]  # (index of the model's part in the point, knob)


def nearest(values: tuple[int, ...], target: int) -> int:
    """The value of ``values`` (sorted) closest to ``target``; the smaller one on a tie."""
    i = bisect.bisect_left(values, target)
    candidates = values[max(0, i - 1) : i + 1]
    return min(candidates, key=lambda value: (abs(value - target), value))


class Space:
    def __init__(self, study: Study) -> None:
        self.study = study
        self.families = study.families
        self.models = study.model_names
        self.per_model: tuple[tuple[Family, ...], ...] = tuple(study.families_of(m) for m in self.models)
        self._by_label = {f.label: f for f in self.families}
        self._model_of = {f.label: i for i, families in enumerate(self.per_model) for f in families}

    # ---- points and their parts -------------------------------------------------------------------------

    def make(self, parts: Sequence[Config]) -> Point:
        return AppConfig(tuple(parts)) if self.study.is_app else parts[0]

    def family(self, config: Config) -> Family:
        return self.study.family(config.family)

    def part_index(self, family: Family) -> int:
        return self._model_of.get(family.label, 0)

    def _part_in(self, config: Config, i: int) -> bool:
        family = self._by_label.get(config.family)
        return (
            family is not None
            and self._model_of[family.label] == i
            and all(config.knob(knob) in family.values(knob) for knob in KNOBS)
        )

    def __contains__(self, point: Point) -> bool:
        if isinstance(point, AppConfig) != self.study.is_app or len(point.parts) != len(self.models):
            return False
        return all(self._part_in(part, i) for i, part in enumerate(point.parts))

    def __len__(self) -> int:
        return self.study.size

    def model_configs(self, i: int) -> list[Config]:
        """Every config of model ``i``, grouped so that consecutive ones differ in workers only where possible
        (family, inter-op threads, pinning, delay, batch size, threads, then workers ascending): the runner then
        re-registers or restarts workers only when it must."""
        return [
            Config(f.label, w, b, d, t, io, bool(pin))
            for f in self.per_model[i]
            for io in f.values("inter_op_threads")
            for pin in f.values("pinning")
            for d in f.batch_delays_ms
            for b in f.batch_sizes
            for t in f.values("threads")
            for w in f.workers
        ]

    def configs(self) -> list[Point]:
        """Every point; in an app, the last model's configs vary fastest."""
        return [
            self.make(parts) for parts in itertools.product(*(self.model_configs(i) for i in range(len(self.models))))
        ]

    # ---- moves ---------------------------------------------------------------------------------------------

    def axes(self, point: Point) -> list[Axis]:
        return [
            (i, knob) for i, part in enumerate(point.parts) for knob in KNOBS if len(self.family(part).values(knob)) > 1
        ]

    def index(self, point: Point, axis: Axis) -> int:
        """The position of ``point``'s value along ``axis`` among its family's values."""
        i, knob = axis
        part = point.parts[i]
        return self.family(part).values(knob).index(part.knob(knob))

    def step(self, point: Point, axis: Axis, delta: int) -> Point | None:
        """The point ``delta`` places along ``axis``, or None off the edge."""
        i, knob = axis
        part = point.parts[i]
        values = self.family(part).values(knob)
        at = values.index(part.knob(knob)) + delta
        if not 0 <= at < len(values):
            return None
        return self._with_part(point, i, part.with_knob(knob, values[at]))

    def project(self, point: Point, family: Family) -> Point:
        """The point with ``family`` for its model and knobs nearest to the current ones."""
        i = self.part_index(family)
        part = point.parts[i]
        moved = Config(family.label, 0, 0, 0)
        for knob in KNOBS:
            moved = moved.with_knob(knob, nearest(family.values(knob), part.knob(knob)))
        return self._with_part(point, i, moved)

    def shares(self, point: Point) -> list[Point]:
        """An app's share moves: one model's workers up a step, another's down a step (the cores change hands)."""
        out: list[Point] = []
        for i, j in itertools.permutations(range(len(point.parts)), 2):
            up = self.step(point, (i, "workers"), 1)
            if up is not None and (moved := self.step(up, (j, "workers"), -1)) is not None:
                out.append(moved)
        return out

    def neighbours(self, point: Point) -> list[Point]:
        """One step along each knob, the anti-diagonals (more workers with a smaller batch, and the reverse, which
        follow an SLA boundary), an app's share moves, and the same knobs in every other family."""
        out: list[Point | None] = []
        for i in range(len(point.parts)):
            for knob in KNOBS:
                for delta in (-1, 1):
                    out.append(self.step(point, (i, knob), delta))
            for dw, db in ((1, -1), (-1, 1)):
                moved = self.step(point, (i, "workers"), dw)
                out.append(None if moved is None else self.step(moved, (i, "batch_size"), db))
        out += self.shares(point)
        for i, part in enumerate(point.parts):
            out += [self.project(point, f) for f in self.per_model[i] if f.label != part.family]
        return unique(p for p in out if p is not None)

    def _with_part(self, point: Point, i: int, part: Config) -> Point:
        parts = list(point.parts)
        parts[i] = part
        return self.make(parts)


def unique(points: Iterable[Point]) -> list[Point]:
    return list(dict.fromkeys(points))


def order_key(config: Config) -> tuple[object, ...]:
    return (config.family, config.inter_op_threads, config.pinning, config.batch_delay_ms, config.batch_size,
            config.threads, config.workers)  # fmt: skip


def cheap_order(points: Iterable[Point]) -> list[Point]:
    """Sorted so that points needing the same registrations (family, delay, batch) run together, workers rising."""
    return sorted(points, key=lambda p: tuple(order_key(part) for part in p.parts))
