"""The degradation ladder: what a session gives up under load, in which order.

Each session gets a ladder of rungs built from what it asked for; rung 0 is full quality
and every rung below it gives up one more thing, always in this order::

    lookahead L -> 0,  steps 4 -> 3 -> 2,  fps 24 -> 16 -> 12,  bucket 128 -> 64 (last)

Rungs that would change nothing are left out (L already 0, fps already at the floor...). A
few-step student is trained for its own step lists only (a Wan recipe's one list: 4 steps for
Self-Forcing, 3 for CausVid): its ladder has step rungs only for the other lists it names, so a
recipe with one list degrades by lookahead, fps and size, and never runs a schedule it was not
trained for (``Capabilities.schedules``).
Recovery climbs the same ladder back, one rung at a time, in reverse, except that a rung
which costs no model time comes back with the rung below it: a session back at full steps
gets its lookahead back in the same move. Lookahead is the slack that absorbs a slow batch;
a session at full cost without it misses frames it would not have missed with it, and a
restore that lands there is undone by those misses (``bench.ladder_burn`` at capacity went
back and forth between the two rungs under it for as long as it ran).

``DegradeController`` moves sessions on their ladders from two load signals: the predicted
utilisation (``Load``, from the cost model, whose scale follows the measured batch times) and
recent misses (deadline misses and skipped frames). Every ``control_interval`` it decides:

- Degrade on sustained overload only. A tick is overloaded when the prediction is above
  ``high`` or ``miss_threshold`` misses fell within the last ``miss_window``; the ladder
  moves once every tick for ``sustain`` seconds has been overloaded. One slow step, or a
  few, is weathered: it leaves a burst of misses shorter than ``sustain`` and a bump in the
  cost scale that the next normal batches undo. On sustained overload the prediction moves
  as many sessions as it takes to fit under ``high`` at once; misses move one rung per
  tick (they are cleared by a move and must come again).
- Recover as soon as the measured cost allows: no misses in the last ``miss_window``, the
  utilisation *after* the move below ``low`` (hysteresis: one change never undoes the
  last), ``recover_cooldown`` past the last degradation and past the last tick on which
  the cost scale *rose* by more than ``settle`` (a prediction still catching up with a
  slower machine must not talk the ladder up; a falling scale errs on the safe side and
  does not wait). Then one rung every ``climb`` seconds for each session of the class
  that recovers (as many in one tick as stay below ``low``), so a session four rungs down
  is back at full quality about ``4 * climb`` after the load went away. Sessions at the
  same settings climb together where that fits: they share batches, and one climbing alone
  would split a batch in two, which costs more model time than all of them climbing.
- Calm restores what ran before. ``low`` alone would strand a load between ``low`` and
  ``high``: it ran at full quality without trouble, a burst (another program taking the
  core) degraded it, and no recovery could take it back above ``low``. After ``calm``
  seconds with no miss, no degradation and no rising scale, recovery may take the
  utilisation up to ``restore`` (below ``high``, so the prediction alone never undoes it).
  A restore followed by a degradation within twice that calm was misjudged: the calm it
  waits for doubles (up to 8x ``calm``), so a load that cannot hold full quality flips
  ever more rarely; a degradation long after the last restore resets the wait.

Cool-down: a session degrades at most once per ``cooldown``. Priority: the lowest
priority class goes all the way down before a higher class gives up anything, and the
highest class recovers first. Within a class the least degraded session degrades first and
the most degraded recovers first, so the burden is spread.

Before this rule, any tick over ``high`` or with 3 misses in a second degraded at once and
recovery waited 3 s after any degradation or scale movement and 3 s between two rungs of a
session: a browser taking a core for a moment sent one session from level 0 to 5 within
10 s, and it was still at level 3 30 s later (issue 27; ``bench.ladder_burn`` measures it).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from worldserve.session.costmodel import Demand, Load


@dataclass(frozen=True, slots=True)
class Rung:
    """The knobs the ladder turns, as one session currently runs them."""

    fps: float
    lookahead: int
    steps: int
    bucket: int


def build_ladder(
    requested: Rung, buckets: Sequence[int], *, min_steps: int = 2, min_fps: float = 12.0,
    step_counts: Sequence[int] = (),
) -> tuple[Rung, ...]:
    """Rung 0 is ``requested``; each next rung gives up one more thing, in ladder order.
    ``step_counts``: the step counts the model was trained for (a few-step student's lists); the
    step rungs visit only those, none where it names one; empty: every count down to ``min_steps``."""
    rungs = [requested]
    cur = requested
    if cur.lookahead > 0:
        cur = replace(cur, lookahead=0)
        rungs.append(cur)
    fewer = range(cur.steps - 1, min_steps - 1, -1)
    for n in (n for n in fewer if not step_counts or n in step_counts):
        cur = replace(cur, steps=n)
        rungs.append(cur)
    while cur.fps > min_fps:  # 24 -> 16 -> 12: two thirds a rung, so no session loses half at once
        cur = replace(cur, fps=max(min_fps, round(cur.fps * 2 / 3, 3)))
        rungs.append(cur)
    for b in sorted((b for b in buckets if b < requested.bucket), reverse=True):
        cur = replace(cur, bucket=b)
        rungs.append(cur)
    return tuple(rungs)


def describe_change(old: Rung, new: Rung) -> tuple[str, ...]:
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
    settings: Rung  # what the session runs at now


@dataclass(frozen=True, slots=True)
class DegradeOptions:
    high: float = 0.9  # degrade when predicted utilisation is above this
    low: float = 0.7  # recover only if the utilisation after recovering stays below this
    sustain: float = 1.5  # seconds of overload at every tick before anything degrades
    cooldown: float = 1.0  # seconds between two degradations of one session
    recover_cooldown: float = 1.0  # seconds after any degradation (or rise of the scale) before recovering
    climb: float = 0.5  # seconds between two recoveries of one session
    miss_window: float = 0.5  # seconds over which misses count as recent
    miss_threshold: int = 3  # this many recent misses is an overloaded tick, whatever the prediction
    settle: float = 0.1  # cost scale rising more than this (log) per tick: predictions not trusted
    restore: float = 0.85  # after ``calm`` seconds of calm, recovering may take the utilisation up to
    # this (kept within [low, high])
    calm: float = 2.0  # seconds without a miss, a degradation or a rising scale before ``restore`` applies

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError(f"need 0 < low < high, got low={self.low!r} high={self.high!r}")
        if not self.restore > 0:
            raise ValueError(f"restore must be positive, got {self.restore!r}")
        if self.miss_threshold < 1:
            raise ValueError(f"miss_threshold must be >= 1, got {self.miss_threshold!r}")
        times = ("sustain", "cooldown", "recover_cooldown", "climb", "miss_window", "calm")
        bad = {n: getattr(self, n) for n in times if not getattr(self, n) >= 0}
        if bad:
            raise ValueError(f"need non-negative seconds, got {bad}")


@dataclass(slots=True, eq=False)
class LadderState:
    """Where one session stands on its ladder. Higher ``priority`` is more important."""

    session_id: str
    priority: int
    order: int  # admission order, the last tie-break
    rungs: tuple[Rung, ...]
    level: int = 0
    changed_at: float = float("-inf")

    @property
    def settings(self) -> Rung:
        return self.rungs[self.level]

    @property
    def at_bottom(self) -> bool:
        return self.level == len(self.rungs) - 1


DemandOf = Callable[[Rung], Demand]


class DegradeController:
    """Decides ladder moves from predicted utilisation and recent misses."""

    def __init__(self, options: DegradeOptions | None = None) -> None:
        self.options = options or DegradeOptions()
        self._misses: deque[float] = deque()
        self._last_degrade = float("-inf")
        self._scale = 1.0  # the cost model's scale at the last tick
        self._rising = float("-inf")  # when the scale last rose by more than ``settle``
        self._over_since: float | None = None  # first tick of the current overload
        self._last_miss = float("-inf")
        self._calm = self.options.calm  # the calm ``restore`` waits for; doubles when it misjudged
        self._restored = float("-inf")  # when a recovery last went above ``low``

    def note_miss(self, now: float) -> None:
        self._misses.append(now)
        self._last_miss = max(self._last_miss, now)

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
        if math.log(scale / self._scale) > o.settle:
            self._rising = now
        self._scale = scale
        u = load.utilisation()
        if u > o.high or misses >= o.miss_threshold:
            if self._over_since is None:
                self._over_since = now
            if now - self._over_since < o.sustain:
                return []  # not yet sustained: a spike passes without a move
            return self._degrade(now, states, load, demand_of, predicted=u > o.high)
        self._over_since = None
        quiet = now - max(self._last_degrade, self._rising) >= o.recover_cooldown
        calm = now - max(self._last_degrade, self._rising, self._last_miss) >= self._calm
        ceiling = max(o.low, min(o.restore, o.high)) if calm else o.low
        if misses == 0 and quiet and u < ceiling:
            moved = self._recover(now, states, load, demand_of, ceiling)
            if moved and load.utilisation() >= o.low:
                self._restored = now
            return moved
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
            if now - self._restored < 2 * self._calm:  # a recovery above ``low`` did not hold
                self._calm = min(2 * self._calm, 8 * self.options.calm)
            elif now - self._restored > 8 * self.options.calm:
                self._calm = self.options.calm
            self._last_degrade = now
            self._misses.clear()
        return moved

    def _recover(
        self, now: float, states: Sequence[LadderState], load: Load, demand_of: DemandOf, ceiling: float
    ) -> list[tuple[LadderState, int]]:
        """One rung up for each session of the highest degraded class that may climb, most
        degraded first, while the utilisation after each move stays below ``ceiling``."""
        movable = [s for s in states if s.level > 0]
        if not movable:
            return []
        highest = max(s.priority for s in movable)
        klass = sorted(
            (s for s in movable if s.priority == highest), key=lambda s: (-s.level, s.order)
        )
        moved: list[tuple[LadderState, int]] = []
        ready = [s for s in klass if now - s.changed_at >= self.options.climb]
        for group in _alike(ready):
            # sessions that run alike share batches: one of them climbing alone would split
            # a batch in two and cost more model time than all of them climbing together
            tops = [_up(s, demand_of) for s in group]
            ups = [demand_of(s.rungs[top]) for s, top in zip(group, tops, strict=True)]
            together = len(group) > 1 and load.with_changes([demand_of(s.settings) for s in group], ups) < ceiling
            for s, top, up in zip(group, tops, ups, strict=True):
                if together or load.with_change(demand_of(s.settings), up) < ceiling:
                    moved.append((s, s.level))
                    _move(s, top, now, load, demand_of)
        return moved


def _up(s: LadderState, demand_of: DemandOf) -> int:
    """The level one recovery takes ``s`` to: one rung up, and on past every rung above
    that asks the model for exactly the same (lookahead: chunks made earlier, no more of them)."""
    level = s.level - 1
    while level > 0 and demand_of(s.rungs[level - 1]) == demand_of(s.rungs[level]):
        level -= 1
    return level


def _alike(states: list[LadderState]) -> list[list[LadderState]]:
    """``states`` grouped by the settings they run at, in the order of their first member."""
    groups: dict[Rung, list[LadderState]] = {}
    for s in states:
        groups.setdefault(s.settings, []).append(s)
    return list(groups.values())


def _move(s: LadderState, level: int, now: float, load: Load, demand_of: DemandOf) -> None:
    load.remove(demand_of(s.settings))
    s.level = level
    s.changed_at = now
    load.add(demand_of(s.settings))
