"""Predicted model time per batch, and the load it adds up to.

``CostModel`` starts from warm-up measurements (``Runner.warmup``: seconds per
(bucket, steps, batch size)). Real batch times move one EWMA scale factor (log space, each
sample's pull clipped to a factor of 2, so one stall does not swing it) that multiplies
every prediction: a machine that got slower (contention, heat, a longer KV cache than at
warm-up) is slower at every key, so a session moved to a key it never ran is predicted with
the slowdown already in, and the degradation ladder does not bounce. Unmeasured
batch sizes are interpolated piecewise-linearly between measured ones (extrapolated with
the nearest segment's slope, never below zero); unmeasured step counts are scaled from the
nearest measured count of the same bucket by ``(steps + 1) / (measured + 1)`` (one extra
forward for the commit pass), or not at all for a model whose cost does not fall with fewer
steps (``steps_cost`` False: Rolling Forcing runs one window forward a tick whatever the step
count). An unmeasured bucket is an error: nothing to scale from.

``Load`` turns the sessions' demands into predicted utilisation: model seconds per second
of wall time, 1.0 meaning the model never idles. Sessions that share a bucket, step count
and chunk period are assumed to batch together (up to the largest warmed batch size), and
those of a bucket and period at fewer steps to join the batch at the most steps where that
costs less, as the scheduler's batches do (``session/batching.py``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from worldserve.session.batching import cheaper_together
from worldserve.session.plan import BatchTiming

Key = tuple[int, int]  # (bucket, steps)


@dataclass(frozen=True, slots=True)
class Drift:
    """A real batch time that strayed from its prediction by more than the threshold."""

    bucket: int
    steps: int
    size: int
    predicted: float
    actual: float

    @property
    def ratio(self) -> float:
        return self.actual / self.predicted if self.predicted > 0 else math.inf


class CostModel:
    """Seconds per batch for (bucket, steps, size): warm-up curves times a learnt scale."""

    def __init__(
        self,
        timings: Iterable[BatchTiming] = (),
        *,
        alpha: float = 0.2,
        drift_threshold: float = 0.25,
        steps_cost: bool = True,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if not drift_threshold > 0:
            raise ValueError(f"drift_threshold must be > 0, got {drift_threshold!r}")
        self.alpha = alpha
        self.steps_cost = steps_cost  # False: a batch costs the same at any step count
        self.drift_threshold = drift_threshold
        self.scale = 1.0  # EWMA (log space) of actual / warm-up prediction over real batches
        self.drifts = 0  # batches whose time drifted past the threshold, ever
        self._points: dict[Key, dict[int, float]] = {}
        self._base: dict[tuple[int, int, int], float] = {}  # memo of warm-up predictions
        for t in timings:
            self.set_point(t.bucket, t.steps, t.size, t.seconds)

    def set_point(self, bucket: int, steps: int, size: int, seconds: float) -> None:
        """Record a warm-up measurement."""
        if size < 1 or steps < 1 or not seconds >= 0:
            raise ValueError(f"bad timing: {bucket=} {steps=} {size=} {seconds=}")
        self._points.setdefault((bucket, steps), {})[size] = seconds
        self._base.clear()

    def buckets(self) -> set[int]:
        return {b for b, _ in self._points}

    def predict(self, bucket: int, steps: int, size: int) -> float:
        """Predicted seconds for one batch of ``size`` chunks (all steps, commit, decode)."""
        return self.base(bucket, steps, size) * self.scale

    def base(self, bucket: int, steps: int, size: int) -> float:
        """The warm-up curves' prediction, before the learnt scale."""
        k = (bucket, steps, size)
        hit = self._base.get(k)
        if hit is None:
            hit = self._base[k] = self._interpolate(bucket, steps, size)
        return hit

    def observe(self, timing: BatchTiming) -> Drift | None:
        """Fold a real batch time into the scale; return a ``Drift`` if it strayed."""
        b, s, n, actual = timing.bucket, timing.steps, timing.size, timing.seconds
        if n < 1 or s < 1 or not actual >= 0:
            return None
        if b not in self.buckets():  # never warmed: take the time as its first measurement
            self.set_point(b, s, n, actual / self.scale)
            return None
        base = self.base(b, s, n)
        if base <= 0:
            return None
        predicted = base * self.scale
        # EWMA in log space, each sample's pull clipped: one GC pause moves it <= 2**alpha
        self.scale *= min(max(actual / predicted, 0.5), 2.0) ** self.alpha
        lo, hi = predicted / (1 + self.drift_threshold), predicted * (1 + self.drift_threshold)
        if lo <= actual <= hi:
            return None
        self.drifts += 1
        return Drift(b, s, n, predicted, actual)

    def _interpolate(self, bucket: int, steps: int, size: int) -> float:
        pts = self._points.get((bucket, steps))
        if pts is not None:
            return _interpolate(pts, size)
        measured = [s for b, s in self._points if b == bucket]
        if not measured:
            raise KeyError(
                f"no cost measurements for bucket {bucket}; measured: {sorted(self.buckets())}"
            )
        near = min(measured, key=lambda s: (abs(s - steps), -s))
        per_step = (steps + 1) / (near + 1) if self.steps_cost else 1.0
        return _interpolate(self._points[(bucket, near)], size) * per_step


def _interpolate(pts: dict[int, float], n: int) -> float:
    """Piecewise-linear seconds at batch size ``n`` through the measured points."""
    if n in pts:
        return pts[n]
    xs = sorted(pts)
    if len(xs) == 1:
        x, y = xs[0], pts[xs[0]]
        return y if n < x else y * n / x  # fewer: no dearer; more: at worst linear
    i = bisect.bisect_left(xs, n)
    if i == 0:  # below the smallest: extend the first segment, no cheaper than linear via 0
        x0, x1 = xs[0], xs[1]
        y0, y1 = pts[x0], pts[x1]
        return max(y0 - (y1 - y0) / (x1 - x0) * (x0 - n), y0 * n / x0, 0.0)
    if i == len(xs):  # above the largest: the last segment's slope, never falling
        x0, x1 = xs[-2], xs[-1]
        y0, y1 = pts[x0], pts[x1]
        return y1 + max((y1 - y0) / (x1 - x0), 0.0) * (n - x1)
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = pts[x0], pts[x1]
    return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class Demand:
    """What one session asks of the model: a chunk of (bucket, steps) every ``period`` s."""

    bucket: int
    steps: int
    period: float


class Load:
    """Predicted utilisation of the model by a multiset of demands."""

    __slots__ = ("_counts", "cost", "max_batch")

    def __init__(self, cost: CostModel, max_batch: int) -> None:
        self.cost = cost
        self.max_batch = max_batch
        self._counts: dict[Demand, int] = {}

    def add(self, d: Demand) -> None:
        self._counts[d] = self._counts.get(d, 0) + 1

    def remove(self, d: Demand) -> None:
        n = self._counts[d] - 1
        if n:
            self._counts[d] = n
        else:
            del self._counts[d]

    def __len__(self) -> int:
        return sum(self._counts.values())

    def utilisation(self) -> float:
        """Model seconds needed per second of wall time (1.0 = always busy)."""
        by_clock: dict[tuple[int, float], list[tuple[int, int]]] = {}
        for d, n in self._counts.items():
            by_clock.setdefault((d.bucket, d.period), []).append((d.steps, n))
        total = 0.0
        for (bucket, period), groups in by_clock.items():
            groups.sort(reverse=True)
            top, size = groups[0]
            for steps, n in groups[1:]:  # fewer steps: in the top batch where that costs less
                if cheaper_together(self._group_cost, bucket, top, size, steps, n):
                    size += n
                else:
                    total += self._group_cost(bucket, steps, n) / period
            total += self._group_cost(bucket, top, size) / period
        return total

    def with_change(self, remove: Demand | None, add: Demand | None) -> float:
        """Utilisation if ``remove`` left and ``add`` joined (the load itself is unchanged)."""
        return self.with_changes(() if remove is None else (remove,), () if add is None else (add,))

    def with_changes(self, remove: Sequence[Demand], add: Sequence[Demand]) -> float:
        """Utilisation if every demand of ``remove`` left and every one of ``add`` joined."""
        for d in remove:
            self.remove(d)
        for d in add:
            self.add(d)
        try:
            return self.utilisation()
        finally:
            for d in add:
                self.remove(d)
            for d in remove:
                self.add(d)

    def _group_cost(self, bucket: int, steps: int, n: int) -> float:
        full, rest = divmod(n, self.max_batch)
        total = full * self.cost.predict(bucket, steps, self.max_batch) if full else 0.0
        if rest:
            total += self.cost.predict(bucket, steps, rest)
        return total
