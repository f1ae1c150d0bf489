"""The contract for model families whose blocks and frames differ from the default's: a shorter
first block on the frame clock and in the scheduler, frame sizes and controls from the runner,
and a latent model state through snapshots (version 5, and an older worker's version 2)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from tests.session.fakes import model_state
from worldserve.session.clock import FrameClock, ManualClock
from worldserve.session.costmodel import CostModel
from worldserve.session.errors import SnapshotError
from worldserve.session.fake_runner import FakeRunner, decode_frame
from worldserve.session.options import RunnerInfo
from worldserve.session.plan import CONTROLS, ModelState, SessionSpec
from worldserve.session.scheduler import ChunkReady, Scheduler, SchedulerOptions
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import VERSION, restore, snapshot


def test_a_shorter_first_slot_keeps_every_later_slot_one_period_apart() -> None:
    clk = FrameClock(10.0, fps=12.0, frames_per_chunk=12, lookahead=0, first_frames=9)
    assert [clk.display(s) for s in range(4)] == [10.0, 10.75, 11.75, 12.75]
    assert clk.frames_before(3) == 9 + 12 + 12
    assert clk.slot_at(10.76) == 2 and clk.slot_at(10.75) == 1
    assert clk.slots_displayed(10.74) == 1 and clk.slots_displayed(10.75) == 2


def test_runner_info_fills_the_defaults_of_a_runner_that_says_nothing() -> None:
    info = RunnerInfo.of(FakeRunner(frames_per_chunk=2), (1,))
    assert (info.frames_in_block(0), info.block_start(3)) == (2, 6)
    assert info.frame_size(64) == (64, 64) and info.controls == CONTROLS
    wan_like = RunnerInfo.of(FakeRunner(frames_per_chunk=12, first_chunk_frames=9, controls=("prompt",)), (1,))
    assert [wan_like.frames_in_block(n) for n in range(3)] == [9, 12, 12]
    assert [wan_like.block_start(n) for n in range(4)] == [0, 9, 21, 33]
    assert wan_like.controls == ("prompt",)
    with pytest.raises(ValueError, match="unknown controls"):
        RunnerInfo((64,), 1, 4, (1,), controls=("joystick",))


def test_the_scheduler_paces_a_shorter_first_block_and_counts_its_frames() -> None:
    clock = ManualClock()
    runner = FakeRunner(frames_per_chunk=12, first_chunk_frames=9, sleep=clock.advance)
    info = RunnerInfo.of(runner, (1, 2))
    sched = Scheduler(info, CostModel(runner.warmup((1, 2))), clock, SchedulerOptions())
    sched.add_session("s", SessionSpec("s", 64, 0, ""), fps=24.0, lookahead=0)
    ready: list[ChunkReady] = []
    while len(ready) < 3:
        clock.set(sched.next_wakeup())
        plan = sched.schedule()
        ready += [e for e in sched.update(plan, runner.execute(plan)) if isinstance(e, ChunkReady)]
    assert [len(e.frames) for e in ready] == [9, 12, 12]
    assert [decode_frame(e.frames[0])[0] for e in ready] == [0, 9, 21]
    shown = [e.display_time or 0.0 for e in ready]
    assert shown[1] - shown[0] == pytest.approx(9 / 24) and shown[2] - shown[1] == pytest.approx(12 / 24)
    assert sched.stats("s").frames_committed == 33


def latent_state() -> ModelState:
    rng = np.random.default_rng(0)
    return ModelState(
        bucket=32, frames=np.zeros((0, 32, 48, 3), np.uint8), sink_count=1, frame_index=6,
        rng=rng.integers(0, 256, 16, dtype=np.uint8), scene="fox",
        latents=rng.standard_normal((6, 4, 4, 6)).astype(np.float32), family="wan-causal",
    )


def session() -> Session:
    return Session.create(SessionConfig(fps=16.0, bucket=32, steps=4), scene="fox")[0]


def test_a_latent_model_state_round_trips_and_a_pixel_one_has_no_latents() -> None:
    data = snapshot(session(), latent_state())
    assert msgpack.unpackb(data)["version"] == VERSION
    _, st = restore(data)
    want = latent_state()
    assert st.family == "wan-causal" and st.sink_count == 1 and st.frames.shape == (0, 32, 48, 3)
    assert st.latents is not None and np.array_equal(st.latents, want.latents)
    pixel = snapshot(Session.create(SessionConfig(fps=16.0, bucket=8, steps=4), scene="s")[0], model_state())
    assert msgpack.unpackb(pixel)["model"]["latents"] is None
    assert restore(pixel)[1].latents is None


def test_a_bad_latent_state_is_a_snapshot_error() -> None:
    doc = msgpack.unpackb(snapshot(session(), latent_state()))
    doc["model"]["latents"]["dtype"] = "float16"
    with pytest.raises(SnapshotError, match=r"latents\.dtype"):
        restore(msgpack.packb(doc))
    doc = msgpack.unpackb(snapshot(session(), latent_state()))
    doc["model"]["sink_count"] = 7
    with pytest.raises(SnapshotError, match="sink_count"):
        restore(msgpack.packb(doc))
    doc = msgpack.unpackb(snapshot(session(), latent_state()))
    del doc["model"]["family"]
    with pytest.raises(SnapshotError, match=r"model: missing keys \[.family.\]"):
        restore(msgpack.packb(doc))
