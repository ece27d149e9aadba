"""What the controller measures as it serves: the arrival rate (:class:`RateMeter`), the share of answers that came
late (:class:`TailMeter`), and each knob set's service time, a batch of n taking a + b·n (:class:`ServiceFit`, a
least-squares fit that forgets old batches, with b's standard error and the largest batch it has seen, so that the
law does not trust it far past what it measured).

All are O(1) per request or batch: an arrival adds one to a counter, a batch updates a few sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class _Bins:
    """Counters over the last ``window_s``, in bins of ``bin_s`` (a ring per counter): :meth:`_bin_at` moves the
    ring to ``now``, emptying the bins it passes."""

    def __init__(self, bin_s: float, window_s: float, counters: int) -> None:
        self.bin_s = bin_s
        self._n = max(2, round(window_s / bin_s))
        self._rings = [[0] * self._n for _ in range(counters)]
        self._bin = 0

    def _bin_at(self, now: float) -> int:
        b = int(now / self.bin_s)
        if b != self._bin:
            if b - self._bin >= self._n:
                self.clear()
            else:
                for ring in self._rings:
                    for i in range(self._bin + 1, b + 1):
                        ring[i % self._n] = 0
            self._bin = b
        return b

    def clear(self) -> None:
        for ring in self._rings:  # in place: a subclass may hold a ring by name
            ring[:] = [0] * self._n


class RateMeter(_Bins):
    """Arrivals per second over the last ``window_s``, counted in bins of ``bin_s``: a step in the load shows in full
    after ``window_s`` (0.5 s by default), and half of it after half that."""

    def __init__(self, bin_s: float = 0.05, window_s: float = 0.5) -> None:
        super().__init__(bin_s, window_s, 1)
        self._counts = self._rings[0]
        self.total = 0

    def arrive(self, now: float) -> None:  # on every request's path: the ring moves only when the bin changes
        b = int(now / self.bin_s)
        if b != self._bin:
            self._bin_at(now)
        self._counts[b % self._n] += 1
        self.total += 1

    def rate(self, now: float) -> float:
        """Arrivals per second: the full bins of the window, and the current bin's part elapsed."""
        b = self._bin_at(now)
        elapsed = (self._n - 1) * self.bin_s + (now - b * self.bin_s)
        return sum(self._counts) / elapsed if elapsed > 0 else 0.0


class TailMeter(_Bins):
    """The share of the requests answered over the last ``window_s`` that were late, counted in bins of ``bin_s``
    (a batch's late requests as the controller estimates them: ``controller.late_in_batch``). ``clear`` forgets it
    all (the workers changed: what was late with the ones before says little of these)."""

    def __init__(self, bin_s: float = 0.5, window_s: float = 5.0) -> None:
        super().__init__(bin_s, window_s, 2)  # answered, late

    def add(self, now: float, size: int, late: int) -> None:
        i = self._bin_at(now) % self._n
        self._rings[0][i] += size
        self._rings[1][i] += late

    def share(self, now: float, least: int = 20) -> float:
        """Late over answered in the window; 0 while fewer than ``least`` requests were answered in it."""
        self._bin_at(now)
        done = sum(self._rings[0])
        return sum(self._rings[1]) / done if done >= least else 0.0

    def worst_second(self, now: float, least: int = 100) -> float:
        """The largest late share of any second in the window (two bins of 0.5 s, the one now included) in which at
        least ``least`` requests were answered (a 1% share is told by a second of 100 answers, not of 20); 0 if none
        had as many. The window's share averages a late second with four good ones; a P99 read per second does not."""
        b = self._bin_at(now)
        n, span = self._n, max(1, round(1.0 / self.bin_s))
        done, late = self._rings
        if sum(done) < least:  # no second can have as many (the common case at a low rate): nothing to look at
            return 0.0
        worst = 0.0
        for end in range(b, b - n + span - 1, -1):
            answered = came_late = 0
            for i in range(end - span + 1, end + 1):
                answered += done[i % n]
                came_late += late[i % n]
            if answered >= least and came_late / answered > worst:
                worst = came_late / answered
        return worst


@dataclass
class _Sums:
    w: float = 0.0
    n: float = 0.0
    nn: float = 0.0
    t: float = 0.0
    nt: float = 0.0
    tt: float = 0.0
    # the same with the weights squared (they decay as decay**2): b's standard error needs them
    w2: float = 0.0
    w2n: float = 0.0
    w2nn: float = 0.0
    count: int = 0


class ServiceFit:
    """A batch's time as a + b·n (milliseconds), fitted by least squares over the batches served, each older batch
    weighing ``decay`` times less (0.99: the last ~100 batches count most), so that the fit follows a model whose cost
    drifts (another model sharing the cores). Where the batches seen were all of one size, b is unknown: a larger
    batch is predicted to cost in proportion (pessimistic), a smaller one as much (pessimistic too).

    How far the fit can be trusted: :meth:`cautious` tilts the line to b's upper confidence bound (a fit from batches
    of one and two sizes tells b poorly, and an underestimated b would let the law's cap run to its bound), and
    :attr:`largest` is the largest batch seen, past which the law extrapolates only so far (``law.EXTRAPOLATE``)."""

    def __init__(self, decay: float = 0.99) -> None:
        self.decay = decay
        self._s = _Sums()
        self._last: tuple[float, float] | None = None  # the last (a, b) told: kept while one batch size is seen
        self.largest = 0  # the largest batch seen (not forgotten: a model's cost at n stays observable)

    @property
    def count(self) -> int:
        return self._s.count

    def add(self, n: int, t_ms: float) -> None:
        s, d = self._s, self.decay
        s.w = s.w * d + 1.0
        s.n = s.n * d + n
        s.nn = s.nn * d + n * n
        s.t = s.t * d + t_ms
        s.nt = s.nt * d + n * t_ms
        s.tt = s.tt * d + t_ms * t_ms
        d2 = d * d
        s.w2 = s.w2 * d2 + 1.0
        s.w2n = s.w2n * d2 + n
        s.w2nn = s.w2nn * d2 + n * n
        s.count += 1
        self.largest = max(self.largest, n)

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b) in ms, both >= 0; None until b can be told (batches of two sizes seen). While the recent batches
        are all of one size (low load: every batch is one request) the last slope told stands, and the line goes
        through what those batches take now: their size's time is measured, only b is not. (Kept whole, the last
        line outlived the cost it was fitted on: a resnet18 fitted at 61.9 ms a request on cold, crowded workers
        went on predicting that for five minutes of batches of one that took 55.4 ms on average, and the
        controller shed requests that would have been in time.)"""
        s = self._s
        if s.w <= 0:
            return None
        mean_n, mean_t = s.n / s.w, s.t / s.w
        var_n = s.nn / s.w - mean_n * mean_n
        if var_n < 0.05:
            if self._last is None:
                return None
            b = self._last[1]
            a = mean_t - b * mean_n
            return (a, b) if a >= 0 else (0.0, mean_t / mean_n)
        b = (s.nt / s.w - mean_n * mean_t) / var_n
        b = max(0.0, b)
        a = mean_t - b * mean_n
        if a < 0:  # no fixed cost seen: a line through the origin
            a, b = 0.0, (s.nt / s.w) / (s.nn / s.w)
        self._last = (a, b)
        return a, b

    def b_stderr(self) -> float:
        """b's standard error (ms per request) under the weights: the residual spread over the spread of the batch
        sizes, ``σ·sqrt(Σw²(n - n̄)²) / Σw(n - n̄)²``, with σ corrected for the two parameters fitted on the
        batches' effective count ``(Σw)² / Σw²``. Infinite while b cannot be told."""
        s = self._s
        if s.w <= 0 or self.coefficients() is None:
            return math.inf
        mean_n = s.n / s.w
        sxx = s.nn - s.n * mean_n  # Σw(n - n̄)²
        if sxx <= 0:
            return math.inf
        s2xx = max(0.0, s.w2nn - 2.0 * mean_n * s.w2n + mean_n * mean_n * s.w2)  # Σw²(n - n̄)²
        effective = s.w * s.w / s.w2
        sigma = self.spread_ms() * math.sqrt(effective / max(1.0, effective - 2.0))
        return sigma * math.sqrt(s2xx) / sxx

    def cautious(self, z: float = 2.0) -> tuple[float, float] | None:
        """(a, b) with b at its upper confidence bound ``b + z·se(b)``, the line turned about the batches' mean
        (n̄, t̄): it predicts what was measured near n̄, and more for a larger batch the less b is known. None
        until b can be told. The law sizes the batch cap with it."""
        fit = self.coefficients()
        seen = self.mean()
        if fit is None or seen is None:
            return None
        se = self.b_stderr()
        if not math.isfinite(se):
            return fit
        mean_n = seen[0]
        a, b = fit
        b_high = b + z * se
        return max(0.0, a + b * mean_n - b_high * mean_n), b_high

    def mean(self) -> tuple[float, float] | None:
        """(mean batch size, mean batch time ms) of the batches weighed, None before any."""
        s = self._s
        return (s.n / s.w, s.t / s.w) if s.w > 0 else None

    def spread_ms(self) -> float:
        """The residual standard deviation of batch times around the fit (ms): the law's margin."""
        s = self._s
        if s.w <= 1:
            return 0.0
        fit = self.coefficients()
        if fit is None:
            mean_t = s.t / s.w
            return math.sqrt(max(0.0, s.tt / s.w - mean_t * mean_t))
        a, b = fit
        # E[(t - a - b n)^2] from the sums
        resid = s.tt - 2 * a * s.t - 2 * b * s.nt + a * a * s.w + 2 * a * b * s.n + b * b * s.nn
        return math.sqrt(max(0.0, resid / s.w))

    def predict(self, n: int) -> float | None:
        """A batch of ``n``'s time (ms); None before any batch was seen."""
        fit = self.coefficients()
        if fit is not None:
            return fit[0] + fit[1] * n
        seen = self.mean()
        if seen is None:
            return None
        mean_n, mean_t = seen
        return mean_t * n / mean_n if n > mean_n else mean_t


__all__ = ["RateMeter", "ServiceFit", "TailMeter"]
