"""The degradation ladder: what a session gives up under load, in which order.

Each session gets a ladder of rungs built from what it asked for; rung 0 is full quality
and every rung below it gives up one more thing, always in this order::

    lookahead L -> 0,  steps 4 -> 3 -> 2,  fps 24 -> 16 -> 12,  bucket 128 -> 64 (last)

Rungs that would change nothing are left out (L already 0, fps already at the floor...).
Recovery climbs the same ladder back, one rung at a time, in reverse.

``DegradeController`` moves sessions on their ladders from two load signals: the predicted
utilisation (``Load``, from the cost model) and recent misses (deadline misses and skipped
frames). Hysteresis: degrade above ``high`` (or on misses), recover only if the
utilisation *after* the recovery stays below ``low``, so one change never undoes the last.
Cool-down: a session changes at most once per ``cooldown``; nobody recovers within
``recover_cooldown`` of a degradation, while misses are recent, or while the cost model is
still learning a new speed (its scale moved by more than ``settle`` in a tick): a
prediction that is still catching up must not talk the ladder back up. Priority: the lowest
priority class goes all the way down before a higher class gives up anything, and the
highest class recovers first. Within a class the least degraded session degrades first
and the most degraded recovers first, so the burden is spread.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from session.costmodel import Demand, Load


@dataclass(frozen=True, slots=True)
class Settings:
    """The knobs the ladder turns, as one session currently runs them."""

    fps: float
    lookahead: int
    steps: int
    bucket: int


def build_ladder(
    requested: Settings, buckets: Sequence[int], *, min_steps: int = 2, min_fps: float = 12.0
) -> tuple[Settings, ...]:
    """Rung 0 is ``requested``; each next rung gives up one more thing, in ladder order."""
    rungs = [requested]
    cur = requested
    if cur.lookahead > 0:
        cur = replace(cur, lookahead=0)
        rungs.append(cur)
    while cur.steps > min_steps:
        cur = replace(cur, steps=cur.steps - 1)
        rungs.append(cur)
    while cur.fps > min_fps:  # 24 -> 16 -> 12: two thirds a rung, so no session loses half at once
        cur = replace(cur, fps=max(min_fps, round(cur.fps * 2 / 3, 3)))
        rungs.append(cur)
    for b in sorted((b for b in buckets if b < requested.bucket), reverse=True):
        cur = replace(cur, bucket=b)
        rungs.append(cur)
    return tuple(rungs)


def describe_change(old: Settings, new: Settings) -> tuple[str, ...]:
    """What changed, for clients and logs: ``("steps 4->3",)``."""
    out = []
    for name in ("lookahead", "steps", "fps", "bucket"):
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            out.append(f"{name} {a:g}->{b:g}")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DegradationChanged:
    """A session moved on its ladder (level 0 is full quality)."""

    session_id: str
    old_level: int
    new_level: int
    changes: tuple[str, ...]  # e.g. ("lookahead 2->0",)
    settings: Settings  # what the session runs at now


@dataclass(frozen=True, slots=True)
class DegradeOptions:
    high: float = 0.9  # degrade when predicted utilisation is above this
    low: float = 0.7  # recover only if the utilisation after recovering stays below this
    cooldown: float = 1.0  # seconds between two changes of one session
    recover_cooldown: float = 3.0  # seconds after any degradation before anyone recovers
    miss_window: float = 1.0  # seconds over which misses count as recent
    miss_threshold: int = 3  # this many recent misses is overload, whatever the prediction
    settle: float = 0.1  # cost scale moving more than this per tick: predictions not trusted

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"need 0 < low < high, got low={self.low!r} high={self.high!r}")
        if self.miss_threshold < 1:
            raise ValueError(f"miss_threshold must be >= 1, got {self.miss_threshold!r}")


@dataclass(slots=True, eq=False)
class LadderState:
    """Where one session stands on its ladder. Higher ``priority`` is more important."""

    session_id: str
    priority: int
    order: int  # admission order, the last tie-break
    rungs: tuple[Settings, ...]
    level: int = 0
    changed_at: float = float("-inf")

    @property
    def settings(self) -> Settings:
        return self.rungs[self.level]

    @property
    def at_bottom(self) -> bool:
        return self.level == len(self.rungs) - 1


DemandOf = Callable[[Settings], Demand]


class DegradeController:
    """Decides ladder moves from predicted utilisation and recent misses."""

    def __init__(self, options: DegradeOptions | None = None) -> None:
        self.options = options or DegradeOptions()
        self._misses: deque[float] = deque()
        self._last_degrade = float("-inf")
        self._scale = 1.0  # the cost model's scale at the last tick
        self._unsettled = float("-inf")  # when the scale last moved by more than ``settle``

    def note_miss(self, now: float) -> None:
        self._misses.append(now)

    def recent_misses(self, now: float) -> int:
        cutoff = now - self.options.miss_window
        while self._misses and self._misses[0] < cutoff:
            self._misses.popleft()
        return len(self._misses)

    def tick(
        self, now: float, states: Sequence[LadderState], load: Load, demand_of: DemandOf
    ) -> list[tuple[LadderState, int]]:
        """Move sessions (mutating their level and ``load``); return (state, old level)."""
        o = self.options
        misses = self.recent_misses(now)
        scale = load.cost.scale
        if abs(math.log(scale / self._scale)) > o.settle:
            self._unsettled = now
        self._scale = scale
        u = load.utilisation()
        if u > o.high or misses >= o.miss_threshold:
            return self._degrade(now, states, load, demand_of, predicted=u > o.high)
        quiet = now - max(self._last_degrade, self._unsettled) >= o.recover_cooldown
        if misses == 0 and quiet and u < o.low:
            return self._recover(now, states, load, demand_of)
        return []

    def _degrade(
        self,
        now: float,
        states: Sequence[LadderState],
        load: Load,
        demand_of: DemandOf,
        predicted: bool,
    ) -> list[tuple[LadderState, int]]:
        movable = [s for s in states if not s.at_bottom]
        if not movable:
            return []
        lowest = min(s.priority for s in movable)
        klass = sorted(
            (s for s in movable if s.priority == lowest), key=lambda s: (s.level, s.order)
        )
        moved: list[tuple[LadderState, int]] = []
        for s in klass:
            if now - s.changed_at < self.options.cooldown:
                continue
            moved.append((s, s.level))
            _move(s, s.level + 1, now, load, demand_of)
            # misses: one rung per tick; prediction: until the prediction fits
            if not predicted or load.utilisation() <= self.options.high:
                break
        if moved:
            self._last_degrade = now
            self._misses.clear()
        return moved

    def _recover(
        self, now: float, states: Sequence[LadderState], load: Load, demand_of: DemandOf
    ) -> list[tuple[LadderState, int]]:
        movable = [s for s in states if s.level > 0]
        if not movable:
            return []
        highest = max(s.priority for s in movable)
        klass = sorted(
            (s for s in movable if s.priority == highest), key=lambda s: (-s.level, s.order)
        )
        for s in klass:
            if now - s.changed_at < self.options.recover_cooldown:
                continue
            up = s.rungs[s.level - 1]
            if load.with_change(demand_of(s.settings), demand_of(up)) < self.options.low:
                old = s.level
                _move(s, old - 1, now, load, demand_of)
                return [(s, old)]
        return []


def _move(s: LadderState, level: int, now: float, load: Load, demand_of: DemandOf) -> None:
    load.remove(demand_of(s.settings))
    s.level = level
    s.changed_at = now
    load.add(demand_of(s.settings))
