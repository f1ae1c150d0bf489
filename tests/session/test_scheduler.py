"""Scheduler behaviour against the fake runner on a manual clock (no real time passes)."""

from __future__ import annotations

from itertools import pairwise
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worldserve.session.admission import AdmissionOptions
from worldserve.session.clock import ManualClock
from worldserve.session.costmodel import CostModel, Drift
from worldserve.session.degrade import DegradeOptions
from worldserve.session.fake_runner import FakeRunner, LinearCost, decode_frame, session_tag
from worldserve.session.plan import ACTION_DIM, SessionSpec, StepOutput, StepPlan
from worldserve.session.scheduler import (
    ChunkReady,
    DeadlineMiss,
    Event,
    FrameSkipped,
    Mode,
    RunnerError,
    RunnerInfo,
    Scheduler,
    SchedulerOptions,
)

SIZES = (1, 2, 4, 8, 16)
E = TypeVar("E")
PERIOD = 1 / 24
# No admission limit and no degradation: these tests are about batching and deadlines.
NO_LIMITS = dict(
    admission=AdmissionOptions(threshold=1e9),
    degrade=DegradeOptions(high=1e9, low=1e8, miss_threshold=10**9),
)


class Sim:
    """A scheduler, a fake runner and a manual clock, stepped like the engine steps them."""

    def __init__(
        self,
        cost: LinearCost | None = None,
        *,
        sizes: tuple[int, ...] = SIZES,
        jitter: float = 0.0,
        schedules: tuple[tuple[float, ...], ...] = (),
        **opts: object,
    ) -> None:
        self.clock = ManualClock(100.0)
        self.runner = FakeRunner(cost=cost, sleep=self.clock.advance, jitter=jitter, schedules=schedules)
        options = SchedulerOptions(**{**NO_LIMITS, **opts})  # type: ignore[arg-type]
        cm = CostModel(self.runner.warmup(sizes))
        self.sched = Scheduler(RunnerInfo.of(self.runner, sizes), cm, self.clock, options)
        self.plans: list[StepPlan] = []
        self.events: list[Event] = []

    def add(
        self,
        sid: str,
        *,
        bucket: int = 64,
        fps: float = 24.0,
        lookahead: int = 0,
        steps: int | None = None,
        mode: Mode = Mode.PUSH,
        priority: int = 0,
    ) -> None:
        verdict = self.sched.add_session(
            sid,
            SessionSpec(sid, bucket, 0, "scene"),
            fps=fps,
            lookahead=lookahead,
            steps=steps,
            mode=mode,
            priority=priority,
            now=self.clock(),
        )
        assert verdict.admitted

    def step(self) -> StepPlan:
        now = self.clock()
        plan = self.sched.schedule(now)
        if plan.is_empty():
            self.events += self.sched.take_events()
            wake = self.sched.next_wakeup(now)
            assert wake > now, "an empty plan must not be followed by a wake-up now"
            self.clock.set(min(wake, now + 10.0))
            return plan
        self.plans.append(plan)
        out = self.runner.execute(plan)
        self.events += self.sched.update(plan, out, self.clock())
        return plan

    def run_until(self, t: float) -> None:
        while self.clock() < t:
            self.step()

    def chunks(self, sid: str) -> list[ChunkReady]:
        return [e for e in self.events if isinstance(e, ChunkReady) and e.session_id == sid]

    def of(self, kind: type[E], sid: str | None = None) -> list[E]:
        """Events of one type, of one session if ``sid`` is given."""
        return [
            e
            for e in self.events
            if isinstance(e, kind) and (sid is None or getattr(e, "session_id", None) == sid)
        ]


def batch_ids(plan: StepPlan) -> list[list[str]]:
    return [[w.session_id for w in b.items] for b in plan.batches]


def test_sessions_whose_deadlines_line_up_share_a_batch() -> None:
    sim = Sim()
    for i in range(5):
        sim.add(f"s{i}")
    sim.run_until(101.0)
    assert sim.runner.batch_sizes.keys() == {5}
    assert all(batch_ids(p) == [[f"s{i}" for i in range(5)]] for p in sim.plans)


def test_sessions_far_apart_in_phase_are_not_batched() -> None:
    sim = Sim(batch_window=0.010, align_phase=False)
    sim.add("a")
    sim.clock.advance(PERIOD / 2)  # b's frames fall half a period after a's
    sim.add("b")
    sim.run_until(101.0)
    assert sim.runner.batch_sizes.keys() == {1}
    assert len(sim.chunks("a")) >= 23 and len(sim.chunks("b")) >= 23


def test_sessions_slightly_out_of_phase_are_pulled_into_one_batch() -> None:
    sim = Sim(batch_window=0.010, align_phase=False)
    sim.add("a")
    sim.clock.advance(0.004)
    sim.add("b")
    sim.run_until(101.0)
    assert sim.runner.batch_sizes.keys() == {2}


def test_different_buckets_never_share_a_batch() -> None:
    sim = Sim()
    sim.add("small")
    sim.add("big", bucket=128)
    sim.run_until(100.5)
    for plan in sim.plans:
        for b in plan.batches:
            assert len(b.items) == 1
            assert all(sim.runner.sessions[w.session_id].bucket == b.bucket for w in b.items)


@pytest.mark.parametrize("first", ["full", "fewer"])
def test_a_session_at_fewer_steps_runs_in_the_batch_at_more_steps_where_that_costs_less(first: str) -> None:
    # a chunk's fixed cost dominates: a second batch costs more than the steps given back
    sim = Sim(LinearCost({64: (0.010, 0.002), 128: (0.010, 0.002)}))
    order = [("full", None), ("fewer", 2)] if first == "full" else [("fewer", 2), ("full", None)]
    for sid, steps in order:
        sim.add(sid, steps=steps)
    sim.run_until(101.0)
    batches = [b for plan in sim.plans for b in plan.batches]
    shared = [b for b in batches if len(b.items) == 2]
    assert len(shared) >= 20 and all(b.steps == 4 for b in shared)  # the more steps of the two
    assert len(sim.chunks("fewer")) >= 23 and not sim.of(DeadlineMiss)


@pytest.mark.parametrize("sizes", [SIZES, (1,)])
def test_a_pull_request_at_fewer_steps_rides_in_the_batch_at_more_steps_only_where_it_fits(
    sizes: tuple[int, ...],
) -> None:
    sim = Sim(sizes=sizes)
    sim.add("fewer", steps=2, mode=Mode.PULL)
    sim.add("full", mode=Mode.PULL)
    now = sim.clock()
    sim.sched.request_block("fewer", 0, deadline=now + 0.100, now=now)
    sim.sched.request_block("full", 0, deadline=now + 0.105, now=now)
    plan = sim.sched.schedule(now)
    if sizes == (1,):  # no room to share: earliest deadline first, each at its own steps
        assert [(b.steps, [w.session_id for w in b.items]) for b in plan.batches] == [(2, ["fewer"]), (4, ["full"])]
    else:  # one batch at 4 steps, members in deadline order
        assert [(b.steps, [w.session_id for w in b.items]) for b in plan.batches] == [(4, ["fewer", "full"])]


def test_sessions_at_different_steps_keep_their_own_batches_where_sharing_costs_more() -> None:
    sim = Sim(LinearCost({64: (0.0, 0.005), 128: (0.0, 0.005)}))  # no fixed cost: a row at 4 steps costs more than at 2
    sim.add("full")
    sim.add("fewer", steps=2)
    sim.run_until(101.0)
    batches = [b for plan in sim.plans for b in plan.batches]
    assert batches and all(len(b.items) == 1 for b in batches)
    assert {b.steps for b in batches if b.items[0].session_id == "fewer"} == {2}


def test_batch_is_sized_to_finish_before_its_earliest_deadline() -> None:
    cost = LinearCost({64: (0.010, 0.005), 128: (0.010, 0.005)})  # 10 ms + 5 ms per chunk
    sim = Sim(cost, margin=0.002)
    for i in range(8):
        sim.add(f"s{i}")
    t0 = sim.clock()
    plan = sim.step()
    # chunk 0 is shown one period after start; 2 ms margin: 5 chunks (35 ms) fit, 6 (40) do not
    assert batch_ids(plan) == [[f"s{i}" for i in range(5)]]
    assert plan.batches[0].deadline == pytest.approx(t0 + PERIOD - 0.002)
    assert t0 + sim.sched.cost.predict(64, 4, 5) <= plan.batches[0].deadline
    second = sim.step()  # the three left out start one slot later instead of delaying the five
    assert {"s5", "s6"} <= set(batch_ids(second)[0])
    assert not sim.of(FrameSkipped)  # nothing was on their screens to repeat
    assert [c.display_time for c in sim.chunks("s5")] == [pytest.approx(t0 + 2 * PERIOD)]
    sim.run_until(t0 + 1.0)
    assert not sim.of(DeadlineMiss)  # nobody is delivered late; skips rotate among equals
    skipped = {
        s: sum(e.frames for e in sim.of(FrameSkipped, s)) for s in (f"s{i}" for i in range(8))
    }
    assert max(skipped.values()) - min(skipped.values()) <= 2


def test_late_push_session_moves_to_a_later_slot_and_does_not_delay_an_on_time_batch() -> None:
    cost = LinearCost({64: (0.010, 0.002), 128: (0.010, 0.002)})  # one chunk: 12 ms
    sim = Sim(cost, start_delay=0.2, margin=0.002, align_phase=False)
    sim.add("late")  # first frame shown at 100.2
    sim.clock.advance(0.015)
    sim.add("b")  # first frames shown at 100.215
    sim.add("c")
    sim.step()  # opens the three sessions; nothing is due yet
    sim.clock.set(100.194)  # "late" can no longer make 100.2 - margin; b and c can
    plan = sim.step()
    assert batch_ids(plan) == [["b", "c"]]
    sim.run_until(101.0)
    assert not sim.of(FrameSkipped)  # nothing was on its screen yet: its clock moved instead
    late = sim.chunks("late")
    assert late[0].display_time == pytest.approx(100.2 + PERIOD)
    assert [c.block_idx for c in late] == list(range(len(late)))


def test_a_late_first_chunk_moves_the_clock_and_skips_nothing() -> None:
    cost = LinearCost({64: (0.010, 0.002), 128: (0.010, 0.002)})
    sim = Sim(cost, start_delay=0.2, margin=0.002)
    sim.add("s")  # first frame meant for 100.2
    sim.clock.set(100.3)  # the model was busy elsewhere: slot 0 and slot 1 have passed
    sim.step()
    sim.run_until(100.6)
    assert not sim.of(FrameSkipped) and not sim.of(DeadlineMiss)
    shown = [c.display_time for c in sim.chunks("s")]
    assert shown[0] == pytest.approx(100.2 + 3 * PERIOD)  # the first slot it can make
    assert shown == pytest.approx([shown[0] + i * PERIOD for i in range(len(shown))])


def test_a_first_chunk_that_finishes_late_starts_the_clock() -> None:
    cost = LinearCost({64: (0.010, 0.002), 128: (0.010, 0.002)})
    sim = Sim(cost, margin=0.002)
    sim.add("s")
    sim.runner.open_seconds = 0.1  # the open (a start frame, an observation) takes model time
    sim.run_until(sim.clock() + 0.5)
    assert not sim.of(DeadlineMiss) and not sim.of(FrameSkipped)
    shown = [c.display_time for c in sim.chunks("s")]
    assert shown == pytest.approx([shown[0] + i * PERIOD for i in range(len(shown))])


def test_overdue_pull_request_runs_after_the_on_time_batches() -> None:
    sim = Sim()
    sim.add("b")
    sim.add("c")
    sim.add("p", mode=Mode.PULL)
    sim.sched.request_block("p", 0, deadline=0.0, now=sim.clock())
    plan = sim.step()
    assert batch_ids(plan) == [["b", "c"], ["p"]]
    assert [e.session_id for e in sim.of(DeadlineMiss)] == ["p"]
    assert [c.block_idx for c in sim.chunks("p")] == [0]


@pytest.mark.parametrize("sizes", [SIZES, (1,)])  # (1,): no batching, so no chunk joins another's step count
@settings(max_examples=30, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.sampled_from([64, 128]), st.sampled_from([2, 3, 4]), st.floats(0.02, 0.5)),
        min_size=1,
        max_size=12,
    )
)
def test_batches_run_earliest_deadline_first(requests: list[tuple[int, int, float]], sizes: tuple[int, ...]) -> None:
    sim = Sim(sizes=sizes)
    for i, (bucket, steps, deadline) in enumerate(requests):
        sim.add(f"p{i}", bucket=bucket, steps=steps, mode=Mode.PULL)
        sim.sched.request_block(f"p{i}", 0, deadline=deadline, now=sim.clock())
    now = sim.clock()
    plan = sim.sched.schedule(now)
    deadlines = [b.deadline for b in plan.batches]
    assert deadlines == sorted(deadlines)
    t = now  # every on-time batch is predicted to finish by its deadline
    for b in plan.batches:
        t += sim.sched.cost.predict(b.bucket, b.steps, len(b.items))
        assert t <= b.deadline + 1e-9
    for b in plan.batches:  # members are in deadline order
        dues = [requests[int(w.session_id[1:])][2] for w in b.items]
        # EDF up to float rounding: deadlines within 1e-9 may tie-break either way
        assert all(x <= y + 1e-9 for x, y in pairwise(dues))


def test_batching_off_steps_every_session_alone() -> None:
    sim = Sim(batching=False)
    for i in range(4):
        sim.add(f"s{i}")
    sim.run_until(101.0)
    assert sim.runner.batch_sizes.keys() == {1}
    assert all(len(sim.chunks(f"s{i}")) >= 23 for i in range(4))


def test_catch_up_after_a_stall_skips_frames_and_keeps_block_idx_consecutive() -> None:
    sim = Sim()
    sim.add("s", lookahead=1)
    sim.run_until(101.0)
    before = len(sim.chunks("s"))
    sim.clock.advance(1.0)  # the model thread stalled for a second
    sim.run_until(sim.clock() + 1.0)
    [skip] = sim.of(FrameSkipped, "s")
    assert skip.block_idx == before and skip.repeat_block_idx == before - 1
    assert 20 <= skip.frames <= 25
    blocks = [c.block_idx for c in sim.chunks("s")]
    assert blocks == list(range(len(blocks)))
    stats = sim.sched.stats("s", sim.clock())
    assert stats.frames_skipped == skip.frames
    # counters close the gap: committed + skipped covers every displayed frame (+ lookahead)
    assert stats.frames_due <= stats.frames_committed + stats.frames_skipped <= stats.frames_due + 3


def test_lookahead_keeps_chunks_ready_ahead_of_display() -> None:
    sim = Sim()
    sim.add("s", lookahead=2)
    ahead = []
    while sim.clock() < 101.0:
        n = len(sim.events)
        sim.step()
        ahead += [
            e.display_time - sim.clock()
            for e in sim.events[n:]
            if isinstance(e, ChunkReady) and e.display_time is not None
        ]
    assert not sim.of(DeadlineMiss) and not sim.of(FrameSkipped)
    assert min(ahead) >= 2 * PERIOD - 0.01  # due two periods before display, and ready by then


def test_a_plan_carries_the_spec_once_then_only_changes_and_freed_ids() -> None:
    sim = Sim()
    sim.add("s")
    first = sim.step()
    assert [s.session_id for s in first.new_sessions] == ["s"] and not first.updates
    sim.run_until(100.2)
    assert all(not p.new_sessions and not p.updates for p in sim.plans[1:])
    sim.sched.set_scene("s", "a desert")
    frame = np.zeros((64, 64, 3), np.uint8)
    sim.sched.observe("s", frame)
    sim.step()
    [upd] = sim.plans[-1].updates
    assert (upd.session_id, upd.scene, upd.bucket, upd.observation is frame) == (
        "s",
        "a desert",
        None,
        True,
    )
    sim.sched.remove_session("s")
    plan = sim.sched.schedule(sim.clock())
    assert plan.freed == ["s"] and not plan.batches
    assert sim.sched.schedule(sim.clock()).is_empty()


def test_changes_before_the_session_opens_go_into_its_spec() -> None:
    sim = Sim()
    sim.add("s")
    sim.sched.set_scene("s", "a forest")
    plan = sim.sched.schedule(sim.clock())
    assert plan.new_sessions[0].scene == "a forest" and not plan.updates


def test_a_readded_session_id_opens_only_after_its_old_state_is_freed() -> None:
    sim = Sim()
    sim.add("s")
    sim.run_until(100.2)
    sim.sched.remove_session("s")
    sim.add("s")
    first = sim.sched.schedule(sim.clock())
    assert first.freed == ["s"] and not first.new_sessions and not first.batches
    second = sim.sched.schedule(sim.clock())
    assert [s.session_id for s in second.new_sessions] == ["s"]


def test_latest_action_wins_and_an_older_sequence_number_is_ignored() -> None:
    sim = Sim()
    sim.add("s")
    a1, a3, a2 = (np.full(ACTION_DIM, v, np.float32) for v in (0.1, 0.3, 0.2))
    assert sim.sched.set_action("s", a1, 1)
    assert sim.sched.set_action("s", a3, 3)
    assert not sim.sched.set_action("s", a2, 2)
    plan = sim.step()
    [work] = plan.batches[0].items
    assert work.action_seq == 3 and np.allclose(work.actions, 0.3)
    with pytest.raises(ValueError, match="shape"):
        sim.sched.set_action("s", np.zeros(3, np.float32), 4)


def test_a_failed_chunk_is_reported_and_retried_with_the_same_block_idx() -> None:
    sim = Sim()
    sim.add("s")
    sim.run_until(100.3)
    n = len(sim.chunks("s"))
    sim.runner.fail["s"] = "bad things"
    sim.run_until(100.6)
    [err] = sim.of(RunnerError, "s")
    assert (err.block_idx, err.message) == (n, "bad things")
    blocks = [c.block_idx for c in sim.chunks("s")]
    assert blocks == list(range(len(blocks)))


def test_pull_blocks_come_back_in_order_once_each() -> None:
    sim = Sim()
    sim.add("p", mode=Mode.PULL)
    for b in range(3):
        assert sim.sched.request_block("p", b, now=sim.clock())
    assert not sim.sched.request_block("p", 1, now=sim.clock())  # a repeat
    with pytest.raises(ValueError, match="expected 3"):
        sim.sched.request_block("p", 5, now=sim.clock())
    for _ in range(5):
        sim.step()
    assert [c.block_idx for c in sim.chunks("p")] == [0, 1, 2]
    assert all(c.display_time is None for c in sim.chunks("p"))
    assert sim.sched.next_wakeup(sim.clock()) == float("inf")


def test_real_times_that_stray_from_the_cost_model_are_reported_as_drift() -> None:
    sim = Sim()
    sim.add("s")
    sim.run_until(100.2)
    assert not sim.of(Drift)
    sim.runner.slowdown = 3.0
    sim.run_until(101.0)
    drifts = sim.of(Drift)
    assert drifts and drifts[0].ratio == pytest.approx(3.0, rel=0.05)
    assert sim.sched.cost.scale == pytest.approx(3.0, rel=0.1)  # the model learnt the slowdown


def test_idle_scheduler_wakes_at_the_next_release() -> None:
    sim = Sim()
    sim.add("s", lookahead=1)
    sim.step()
    wake = sim.sched.next_wakeup(sim.clock())
    assert sim.sched.schedule(wake - 1e-4).is_empty()
    assert not sim.sched.schedule(wake + 1e-9).is_empty()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_block_idx_is_consecutive_and_exactly_once_under_random_load(data: st.DataObject) -> None:
    sim = Sim(
        admission=AdmissionOptions(), degrade=DegradeOptions(cooldown=0.2, recover_cooldown=0.5)
    )
    cost_scale = data.draw(st.sampled_from([1.0, 5.0, 20.0]), label="cost_scale")
    sim.runner.slowdown = cost_scale
    live: dict[str, int] = {}
    for i in range(data.draw(st.integers(30, 80), label="ops")):
        op = data.draw(
            st.sampled_from(["add", "add", "run", "run", "run", "stall", "slow", "fail", "remove"])
        )
        if op == "add":
            sid = f"s{i}"
            verdict = sim.sched.add_session(
                sid,
                SessionSpec(sid, data.draw(st.sampled_from([64, 128])), 0, ""),
                fps=data.draw(st.sampled_from([12.0, 24.0, 30.0])),
                lookahead=data.draw(st.integers(0, 2)),
                priority=data.draw(st.integers(0, 1)),
                now=sim.clock(),
            )
            if verdict.admitted:
                live[sid] = 0
        elif op == "run":
            sim.run_until(sim.clock() + data.draw(st.floats(0.01, 0.3)))
        elif op == "stall":
            sim.clock.advance(data.draw(st.floats(0.0, 0.5)))
        elif op == "slow":
            sim.runner.slowdown = cost_scale * data.draw(st.sampled_from([0.5, 1.0, 2.0, 4.0]))
        elif op == "fail" and live:
            sim.runner.fail[data.draw(st.sampled_from(sorted(live)))] = "injected"
        elif op == "remove" and live:
            sid = data.draw(st.sampled_from(sorted(live)))
            sim.sched.remove_session(sid)
            del live[sid]
    sim.run_until(sim.clock() + 0.3)
    sessions = {e.session_id for e in sim.of(ChunkReady)}
    for sid in sessions:
        chunks = sim.chunks(sid)
        assert [c.block_idx for c in chunks] == list(range(len(chunks)))
        assert all(
            decode_frame(c.frames[0]) == (c.block_idx % 65536, session_tag(sid)) for c in chunks
        )
        display = [c.display_time for c in chunks if c.display_time is not None]
        assert len(display) == len(chunks) and display == sorted(
            display
        )  # a later block is never shown before an earlier one
    for skip in sim.of(FrameSkipped):  # a skip repeats the block before the next one
        assert skip.repeat_block_idx == skip.block_idx - 1


def test_a_session_whose_open_failed_is_freed_and_opened_again() -> None:
    sim = Sim()
    sim.add("s")
    plan = sim.sched.schedule(sim.clock())
    assert [s.session_id for s in plan.new_sessions] == ["s"]
    [err] = sim.sched.update(plan, StepOutput(errors={"s": "out of memory"}), sim.clock())
    assert isinstance(err, RunnerError) and err.message == "out of memory"
    assert sim.sched.schedule(sim.clock()).freed == ["s"]  # whatever half-opened state is freed
    assert sim.sched.schedule(sim.clock()).is_empty()  # and the open waits one period
    sim.run_until(sim.clock() + 0.5)
    blocks = [c.block_idx for c in sim.chunks("s")]
    assert len(blocks) >= 10 and blocks == list(range(len(blocks)))


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_a_session_slower_than_its_frame_period_still_streams(lookahead: int) -> None:
    # one chunk takes 3.5 frame periods: the session must run late and skip slots, never
    # skip every slot forever (with degradation off, nothing else would rescue it)
    sim = Sim(LinearCost({64: (3.5 * PERIOD, 0.0), 128: (7 * PERIOD, 0.0)}))
    sim.add("slow", lookahead=lookahead)
    sim.run_until(sim.clock() + 3.0)
    chunks = sim.chunks("slow")
    assert len(chunks) >= 15  # about one chunk per 3.5 periods over 72 periods
    assert [c.block_idx for c in chunks] == list(range(len(chunks)))
    assert sim.of(FrameSkipped, "slow")


def test_at_saturation_late_sessions_catch_up_together_in_big_batches() -> None:
    # eight sessions asking for 240 fps from a model that needs 30 ms for one chunk and
    # 44 ms for eight: every session is late all the time. Skipping each one only to the
    # slot it could make alone would run batches of one (about 33 chunks/s); skipping to
    # the slot the late ones can make together runs batches of eight (about 180 chunks/s)
    cost = LinearCost({64: (0.028, 0.002), 128: (0.056, 0.004)})
    sim = Sim(cost)
    for i in range(8):
        sim.add(f"s{i}", fps=240.0)
    start = sim.clock()
    sim.run_until(start + 5.0)
    sizes = [len(b.items) for p in sim.plans for b in p.batches]
    delivered = sum(len(sim.chunks(f"s{i}")) for i in range(8))
    assert np.mean(sizes) >= 6, sizes[:20]
    assert delivered / 5.0 > 100
    for i in range(8):  # and every session's blocks stay consecutive
        chunks = sim.chunks(f"s{i}")
        assert [c.block_idx for c in chunks] == list(range(len(chunks)))


@pytest.mark.parametrize("align", [True, False])
def test_a_session_that_joins_later_runs_in_phase_with_the_running_ones(align: bool) -> None:
    sim = Sim(align_phase=align)
    sim.add("a")
    sim.run_until(100.5)
    sim.clock.advance(0.013)  # joins 13 ms off a's grid: beyond the batch window
    sim.add("b")
    sim.run_until(101.5)
    a, b = sim.chunks("a"), sim.chunks("b")
    offset = (b[0].display_time - a[0].display_time) / PERIOD
    together = [ids for p in sim.plans[-10:] for ids in batch_ids(p)]
    if align:
        assert offset == pytest.approx(round(offset), abs=1e-6)
        assert b[0].display_time - 100.513 <= 2 * PERIOD + 1e-6  # at most one period later
        assert all(sorted(ids) == ["a", "b"] for ids in together)
    else:
        assert offset != pytest.approx(round(offset), abs=1e-3)
        assert all(len(ids) == 1 for ids in together)


def test_a_batch_may_spend_lookahead_rather_than_split() -> None:
    # 10 ms + 5 ms a chunk: five together take 35 ms, more than the 20 ms until they are
    # due, less than the 61.7 ms until they are shown. One batch of five, not 2 + 3.
    cost = LinearCost({64: (0.010, 0.005), 128: (0.010, 0.005)})
    sim = Sim(cost, start_delay=0.020, margin=0.002)
    for i in range(5):
        sim.add(f"s{i}", lookahead=1)
    plan = sim.step()
    assert batch_ids(plan) == [[f"s{i}" for i in range(5)]]
    sim.run_until(sim.clock() + 1.0)
    assert not sim.of(DeadlineMiss) and not sim.of(FrameSkipped)
    assert set(sim.runner.batch_sizes) == {5}
