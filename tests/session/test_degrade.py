"""The degradation ladder and its controller: order, priority, hysteresis, cool-down, and
the calm rule: a spike moves nothing, sustained overload degrades, recovery is prompt."""

from __future__ import annotations

from itertools import pairwise

from worldserve.session.admission import AdmissionOptions
from worldserve.session.costmodel import CostModel, Demand, Load
from worldserve.session.degrade import (
    DegradationChanged,
    DegradeController,
    DegradeOptions,
    LadderState,
    Rung,
    build_ladder,
    describe_change,
)
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.scheduler import DeadlineMiss, FrameSkipped, RunnerError

from .test_scheduler import Sim

FULL = Rung(fps=24.0, lookahead=2, steps=4, bucket=128)
LADDER_DOWN = [
    ("lookahead 2->0",),
    ("steps 4->3",),
    ("steps 3->2",),
    ("fps 24->16",),
    ("fps 16->12",),
    ("bucket 128->64",),
]


def demand_of(s: Rung) -> Demand:
    return Demand(s.bucket, s.steps, 1 / s.fps)


class World:
    """Sessions on ladders over a cost model whose scale sets the load."""

    def __init__(self, priorities: list[int], scale: float, **opts: float) -> None:
        self.cost = CostModel(FakeRunner().warmup((1, 2, 4, 8, 16)))
        self.cost.scale = scale
        self.load = Load(self.cost, 16)
        self.ctrl = DegradeController(DegradeOptions(**opts))  # type: ignore[arg-type]
        rungs = build_ladder(FULL, (64, 128))
        self.states = [LadderState(f"s{i}", p, i, rungs) for i, p in enumerate(priorities)]
        for s in self.states:
            self.load.add(demand_of(s.settings))
        self.t = 0.0
        self.moves: list[tuple[str, int, int]] = []
        self.move_times: list[float] = []

    def run(self, seconds: float, tick: float = 0.25) -> None:
        end = self.t + seconds
        while self.t < end:
            for s, old in self.ctrl.tick(self.t, self.states, self.load, demand_of):
                self.moves.append((s.session_id, old, s.level))
                self.move_times.append(self.t)
            self.t += tick

    def levels(self) -> list[int]:
        return [s.level for s in self.states]


def test_ladder_order_is_lookahead_then_steps_then_fps_then_resolution() -> None:
    rungs = build_ladder(FULL, (64, 128))
    assert [describe_change(a, b) for a, b in pairwise(rungs)] == LADDER_DOWN


def test_ladder_leaves_out_rungs_that_would_change_nothing() -> None:
    assert build_ladder(Rung(12.0, 0, 2, 64), (64, 128)) == (Rung(12.0, 0, 2, 64),)


def test_a_model_trained_for_one_step_list_has_no_step_rung() -> None:
    rungs = build_ladder(FULL, (64, 128), step_counts=(4,))
    assert [describe_change(a, b) for a, b in pairwise(rungs)] == [
        c for c in LADDER_DOWN if not c[0].startswith("steps")]
    assert {r.steps for r in rungs} == {4}


def test_the_step_rungs_visit_only_the_step_lists_the_model_was_trained_for() -> None:
    rungs = build_ladder(Rung(16.0, 0, 4, 64), (64,), step_counts=(4, 2))
    assert [describe_change(a, b) for a, b in pairwise(rungs)] == [("steps 4->2",), ("fps 16->12",)]


def test_a_scheduler_over_a_one_list_model_degrades_without_touching_the_steps() -> None:
    sim = Sim(degrade=DegradeOptions(cooldown=0.2, recover_cooldown=0.5), schedules=((1000.0, 900.0, 700.0, 400.0),))
    sim.add("s", bucket=128, lookahead=2)
    sim.runner.slowdown = 30.0
    sim.run_until(sim.clock() + 8.0)
    changes = [e.changes for e in sim.of(DegradationChanged, "s")]
    assert changes == [c for c in LADDER_DOWN if not c[0].startswith("steps")], changes
    assert {steps for _, steps, _ in sim.runner.history} == {4}  # every chunk at the trained list


def test_overload_degrades_until_the_prediction_fits_and_recovery_climbs_back_in_reverse() -> None:
    w = World([0, 0, 0, 0], scale=4.0, cooldown=1.0, recover_cooldown=2.0)
    w.run(20)
    assert w.load.utilisation() <= 0.9
    assert max(w.levels()) - min(w.levels()) <= 1  # spread over the class
    down = len(w.moves)
    w.cost.scale = 0.5  # load falls
    w.run(60)
    assert w.levels() == [0, 0, 0, 0]
    ups = w.moves[down:]
    # one rung at a time, reverse order; lookahead (level 1, no model time) comes back with steps
    assert all(new == old - 1 if old != 2 else new == 0 for _, old, new in ups)


def test_lower_priority_sessions_degrade_fully_before_higher_ones_change() -> None:
    w = World([1, 0], scale=8.0, cooldown=0.5)
    w.run(30)
    first_high = next(i for i, (sid, _, _) in enumerate(w.moves) if sid == "s0")
    low_moves = [m for m in w.moves[:first_high] if m[0] == "s1"]
    assert low_moves[-1][2] == len(w.states[1].rungs) - 1  # s1 reached the bottom first


def test_higher_priority_sessions_recover_first() -> None:
    w = World([1, 0], scale=8.0, cooldown=0.5, recover_cooldown=1.0)
    w.run(30)
    w.cost.scale = 0.2
    start = len(w.moves)
    w.run(60)
    ups = [sid for sid, old, new in w.moves[start:] if new < old]
    assert ups and ups[0] == "s0"
    assert w.levels() == [0, 0]


def test_steady_load_at_the_boundary_does_not_oscillate() -> None:
    # scale so that full quality sits just above `high`: one rung down fits, one up does not
    w = World([0, 0, 0, 0, 0, 0], scale=1.0, high=0.9, low=0.7, cooldown=0.5, recover_cooldown=1.0)
    u_full = w.load.utilisation()
    w.cost.scale = 0.92 / u_full
    w.run(5)
    settled = len(w.moves)
    assert settled >= 1
    w.run(120)
    assert len(w.moves) == settled  # no change for two minutes under the same load


def test_load_between_low_and_high_changes_nothing() -> None:
    w = World([0, 0, 0], scale=1.0, high=0.9, low=0.5)
    w.cost.scale = 0.7 / w.load.utilisation()
    w.run(60)
    assert w.moves == []


def test_misses_that_keep_coming_degrade_even_when_the_prediction_fits() -> None:
    w = World([0, 0], scale=0.1, miss_threshold=3, miss_window=0.5, cooldown=0.5, sustain=1.0)
    while w.t < 1.25:  # 3 misses a tick: the prediction fits, the deadlines do not
        for _ in range(3):
            w.ctrl.note_miss(w.t)
        w.run(0.25)
    assert [(sid, new) for sid, _, new in w.moves] == [("s0", 1)]  # one rung, not a cascade
    w.run(0.5)  # the misses were consumed by that move and stopped: no second rung
    assert len(w.moves) == 1
    w.run(1.0)  # no misses and the prediction fits: back up, one cool-down after the move
    assert w.moves[1:] == [("s0", 1, 0)] and w.move_times[1] <= w.move_times[0] + 1.0


def test_a_burst_of_misses_from_one_slow_step_moves_nothing() -> None:
    w = World([0, 0], scale=0.1)
    for _ in range(12):  # a stall: every session missed and skipped at once
        w.ctrl.note_miss(0.0)
    w.run(10.0)
    assert w.moves == []


def test_a_session_changes_at_most_once_per_cooldown() -> None:
    w = World([0], scale=20.0, cooldown=1.0, sustain=0.0)  # the cool-down alone
    w.run(2.95, tick=0.1)
    assert len(w.moves) == 3  # at t = 0, 1 and 2, although overloaded at every tick


def test_overload_moves_nothing_until_it_has_lasted_the_sustain_time() -> None:
    w = World([0], scale=20.0, cooldown=0.25, sustain=1.5)
    w.run(1.45)
    assert w.moves == []
    w.run(0.1)
    assert len(w.moves) == 1


def test_recovery_climbs_one_rung_per_climb_interval_once_the_load_fits() -> None:
    w = World([0, 0], scale=8.0, cooldown=0.25, sustain=0.5, recover_cooldown=1.0, climb=0.5)
    w.run(10)
    bottom = w.levels()
    assert min(bottom) >= 3
    w.cost.scale = 0.2  # the load went away (the scale falls: no wait for it to settle)
    start, t_fit = len(w.moves), w.t
    w.run(10)
    # a move a rung, but the last: full steps and the lookahead come back together
    assert w.levels() == [0, 0] and len(w.moves) - start == sum(bottom) - len(bottom)
    # both climb at once, one rung per 0.5 s each, from 1 s after the last degradation
    assert w.move_times[-1] <= t_fit + 0.5 * (max(bottom) - 1) + 0.25


def test_scheduler_walks_the_ladder_down_in_order_and_back_up_in_reverse() -> None:
    sim = Sim(degrade=DegradeOptions(cooldown=0.2, recover_cooldown=0.5))
    sim.add("s", bucket=128, lookahead=2)
    sim.runner.slowdown = 30.0  # the machine got 30x slower: the cost model learns it
    sim.run_until(sim.clock() + 8.0)
    sim.runner.slowdown = 1.0
    sim.run_until(sim.clock() + 12.0)
    changes = [e.changes for e in sim.of(DegradationChanged, "s")]
    up = [_reverse(c) for c in LADDER_DOWN[::-1]]
    # back at full steps, the lookahead (which costs no model time) comes back in the same move
    assert changes == [*LADDER_DOWN, *up[:-2], ("lookahead 0->2", "steps 3->4")], changes
    assert not sim.of(RunnerError)  # bucket switches reached the runner before the batches
    blocks = [c.block_idx for c in sim.chunks("s")]
    assert blocks == list(range(len(blocks)))


def _reverse(change: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for c in change:
        name, values = c.split(" ")
        a, b = values.split("->")
        out.append(f"{name} {b}->{a}")
    return tuple(out)


def test_noisy_steady_load_between_the_thresholds_never_flips_the_ladder() -> None:
    # 8 sessions in one batch every period: 33 ms of 41.7 (u ~ 0.8), each batch +-20 %
    cost = LinearCost({64: (0.009, 0.003), 128: (0.018, 0.006)})
    sim = Sim(cost, jitter=0.2, admission=AdmissionOptions(), degrade=DegradeOptions())
    for i in range(8):
        sim.add(f"s{i}")
    assert 0.7 < sim.sched.utilisation() < 0.9
    sim.run_until(sim.clock() + 60.0)
    for i in range(8):
        levels = [e.new_level for e in sim.of(DegradationChanged, f"s{i}")]
        assert levels == sorted(levels)  # at most down, never down-then-up
    assert len(sim.of(DegradationChanged)) <= 2


# One session at 24 fps, 128 px, 4 steps, lookahead 1: 22 ms a chunk (half the frame period)
CALM = LinearCost({64: (0.010, 0.001), 128: (0.020, 0.002)})


def _calm_sim(sessions: int = 1) -> Sim:
    sim = Sim(CALM, admission=AdmissionOptions(), degrade=DegradeOptions())
    for i in range(sessions):
        sim.add("s" if i == 0 else f"s{i}", bucket=128, lookahead=1)
    sim.run_until(sim.clock() + 3.0)
    assert 0.4 < sim.sched.utilisation() < 0.75
    return sim


def _slow_steps(sim: Sim, n: int, slowdown: float) -> None:
    sim.runner.slowdown = slowdown
    for _ in range(n):
        while sim.step().is_empty():
            pass
    sim.runner.slowdown = 1.0


def test_a_single_slow_step_does_not_degrade() -> None:
    sim = _calm_sim(sessions=2)  # one batch of two, 26 ms
    _slow_steps(sim, 1, 20.0)  # one batch takes 520 ms: both skip frames and miss a deadline
    sim.run_until(sim.clock() + 10.0)
    assert sim.of(FrameSkipped, "s") or sim.of(DeadlineMiss, "s")  # the spike was felt
    assert sim.of(DegradationChanged) == []


def test_a_few_slow_steps_do_not_degrade() -> None:
    sim = _calm_sim()
    for _ in range(3):  # three 220 ms steps, a few frames apart
        _slow_steps(sim, 1, 10.0)
        sim.run_until(sim.clock() + 0.1)
    sim.run_until(sim.clock() + 10.0)
    assert sim.of(DegradationChanged) == []


def test_a_sustained_overload_degrades_within_a_few_seconds() -> None:
    sim = _calm_sim()
    t0 = sim.clock()
    sim.runner.slowdown = 2.5  # 55 ms a chunk against a 41.7 ms period, for good
    sim.run_until(t0 + 5.0)
    moves = sim.of(DegradationChanged, "s")
    assert moves and moves[-1].new_level >= 2
    assert sim.sched.utilisation() <= 0.9  # it degraded until the load fits


def test_after_a_burn_like_slowdown_of_10_s_the_session_is_back_at_level_0_within_5_s() -> None:
    sim = _calm_sim()
    t0 = sim.clock()
    sim.runner.slowdown = 2.5  # another process took a core for 10 s
    sim.run_until(t0 + 10.0)
    fell_to = sim.sched.stats("s").level
    assert fell_to >= 2  # the ladder shed load meanwhile
    sim.runner.slowdown = 1.0
    t_end = sim.clock()
    levels: list[tuple[float, int]] = []
    while sim.clock() < t_end + 15.0:
        sim.step()
        levels.append((sim.clock(), sim.sched.stats("s").level))
    assert levels[-1][1] == 0
    back_at = next(t for t, level in levels if level == 0)
    assert back_at <= t_end + 5.0, f"from level {fell_to} back at level 0 {back_at - t_end:.2f} s after"
    assert all(level == 0 for t, level in levels if t >= back_at)  # and it stays there


def _burn(w: World, seconds: float, per_tick: int = 3) -> None:
    """Misses every tick for ``seconds``: another program took the model's core."""
    end = w.t + seconds
    while w.t < end:
        for _ in range(per_tick):
            w.ctrl.note_miss(w.t)
        w.run(0.25)


def test_after_a_burst_a_load_that_ran_at_full_quality_gets_it_back_within_seconds() -> None:
    # 0.8 of the model at full quality ran without trouble; a burst of misses degrades it,
    # and once the burst is over, the calm lets recovery go back above `low` up to `restore`
    w = World([0, 0, 0], scale=1.0, cooldown=0.5, sustain=1.0)
    w.cost.scale = 0.8 / w.load.utilisation()
    w.run(5)
    assert w.moves == []
    _burn(w, 3.0)
    assert max(w.levels()) >= 2
    end = w.t
    w.run(10)
    assert w.levels() == [0, 0, 0]
    assert w.move_times[-1] - end <= 5.0
    assert 0.7 < w.load.utilisation() < 0.85


def test_without_calm_recovery_stops_at_low() -> None:
    # a stray miss every second is no overload, but it is no calm either: the climb stops at
    # `low`; once the misses stop, it goes on to full quality
    w = World([0, 0, 0], scale=1.0, cooldown=0.5, sustain=1.0, calm=2.0)
    w.cost.scale = 0.8 / w.load.utilisation()
    _burn(w, 3.0)
    for _ in range(10):
        w.ctrl.note_miss(w.t)
        w.run(1.0)
    assert w.load.utilisation() < 0.7 and max(w.levels()) > 0
    w.run(5.0)
    assert w.levels() == [0, 0, 0]


def test_a_restore_that_does_not_hold_waits_longer_each_time() -> None:
    # every climb back to full quality brings misses again: the ladder flips ever more slowly
    w = World([0], scale=1.0, cooldown=0.5, sustain=1.0, calm=2.0)
    w.cost.scale = 0.8 / w.load.utilisation()
    restores: list[float] = []
    while w.t < 90:
        if w.levels() == [0]:
            if not restores or w.t - restores[-1] > 1.0:
                restores.append(w.t)
            _burn(w, 1.5)  # at full quality the deadlines are missed
        else:
            w.run(0.25)
    gaps = [b - a for a, b in pairwise(restores)]
    assert len(gaps) >= 3
    assert gaps[-1] > 2 * gaps[0]  # the calm it waits for doubled (up to 8x)
