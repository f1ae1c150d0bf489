"""Scheduler rules behind the protocol's promises, on a manual clock: a pull session keeps
to the rate it was admitted at, a degraded admission is reported, and a push session whose
chunk takes longer than a frame period starts at once after a skip."""

from __future__ import annotations

from tests.session.test_scheduler import Sim
from worldserve.session.admission import AdmissionOptions
from worldserve.session.degrade import DegradationChanged, DegradeOptions
from worldserve.session.fake_runner import LinearCost
from worldserve.session.plan import SessionSpec
from worldserve.session.scheduler import PULL_BURST, DeadlineMiss, FrameSkipped, Mode


def test_a_pull_session_asking_faster_than_its_fps_gets_its_fps_and_starves_no_push_session() -> None:
    sim = Sim()
    sim.add("push", lookahead=1)
    sim.add("pull", mode=Mode.PULL, fps=1.0)
    t0 = sim.clock()
    asked = 0
    while sim.clock() < t0 + 10.0:  # it keeps every request it may have outstanding
        got = len(sim.chunks("pull"))
        while asked - got < sim.sched.options.pull_queue:
            assert sim.sched.request_block("pull", asked, now=sim.clock())
            asked += 1
        sim.step()
    pulled = sim.chunks("pull")
    assert PULL_BURST + 9 <= len(pulled) <= PULL_BURST + 10  # 1 a second after the burst
    assert [c.block_idx for c in pulled] == list(range(len(pulled)))
    assert not sim.of(DeadlineMiss, "pull")  # its deadlines count from when it may start
    assert not sim.of(FrameSkipped, "push") and len(sim.chunks("push")) >= 230


def test_a_pull_session_is_not_held_below_its_rate() -> None:
    sim = Sim()
    sim.add("pull", mode=Mode.PULL, fps=24.0)
    t0, asked = sim.clock(), 0
    while sim.clock() < t0 + 1.0:  # lockstep: the next request once the last block is in
        if asked == len(sim.chunks("pull")):
            assert sim.sched.request_block("pull", asked, now=sim.clock())
            asked += 1
        sim.step()
    assert 23 <= len(sim.chunks("pull")) <= 25


def test_a_degraded_admission_is_reported_as_a_move_from_level_0() -> None:
    cost = LinearCost({64: (0.02, 0.005), 128: (0.04, 0.01)})
    sim = Sim(cost, admission=AdmissionOptions(threshold=0.85), degrade=DegradeOptions())
    spec = SessionSpec("s", 64, 0, "scene")
    verdict = sim.sched.add_session("s", spec, fps=60.0, lookahead=1, now=sim.clock())
    assert verdict.admitted and verdict.level > 0
    sim.step()
    [moved] = sim.of(DegradationChanged, "s")
    assert (moved.old_level, moved.new_level) == (0, verdict.level)
    assert moved.settings == verdict.settings and "fps 60->40" in moved.changes


def test_a_push_session_slower_than_its_period_generates_after_each_skip() -> None:
    # 56 ms a chunk against a 41.7 ms period, no degradation: it cannot make every slot,
    # but each skip is followed by its chunk, not by another skip of the same block.
    cost = LinearCost({64: (0.045, 0.011), 128: (0.09, 0.02)})
    sim = Sim(cost)
    sim.add("s")
    sim.run_until(sim.clock() + 2.0)
    skips = sim.of(FrameSkipped, "s")
    shown = sim.chunks("s")
    assert skips and len(shown) >= 30  # about one block per chunk time (35 at most)
    per_block: dict[int, int] = {}
    for sk in skips:
        per_block[sk.block_idx] = per_block.get(sk.block_idx, 0) + 1
    assert max(per_block.values()) == 1
    assert [c.block_idx for c in shown] == list(range(len(shown)))
