"""A migration that changes nothing: a session exported after some chunks and restored on a
fresh runner (through snapshot bytes) makes exactly the frames the undisturbed session makes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model.conftest import make_runner, tiny_config
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    ChunkWork,
    ModelState,
    SessionSpec,
    SessionUpdate,
    StepPlan,
)
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import restore, snapshot

SEED, SCENE, BUCKET = 3, "x", 32


def _runner(dtype: torch.dtype = torch.float32) -> ModelRunner:
    # the anchor reference is part of what shapes the next frames
    return make_runner(tiny_config(), dtype=dtype)


def _actions(rng: np.random.Generator) -> np.ndarray:
    a = np.zeros((1, ACTION_DIM), np.float32)
    a[0, rng.integers(0, 4)] = 1.0
    a[0, 4:] = rng.uniform(-1, 1, 2)  # fractional camera shifts: the anchor moves sub-pixel
    return a


def _run(runner: ModelRunner, first: int, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    frames = []
    for block in range(first, first + n):
        out = runner.execute(StepPlan(batches=[Batch(BUCKET, 3, [ChunkWork("s", block, _actions(rng))])]))
        assert not out.errors, out.errors
        frames.append(out.results[0].frames)
    return frames


def _through_snapshot(state: ModelState) -> ModelState:
    session = Session.create(SessionConfig(fps=24.0, bucket=BUCKET, steps=3), scene=SCENE)[0]
    return restore(snapshot(session, state))[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scene_change", [False, True])
def test_a_restored_session_makes_exactly_the_frames_of_the_undisturbed_one(
    dtype: torch.dtype, scene_change: bool
) -> None:
    src = _runner(dtype)
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, SCENE)]))
    _run(src, 0, 6, np.random.default_rng(0))  # past the window: the ring has rolled
    if scene_change:  # the anchor dropped, the view waiting to re-anchor, old-scene keys cached
        src.execute(StepPlan(updates=[SessionUpdate("s", scene="y")]))
        _run(src, 6, 2, np.random.default_rng(1))
    first = src.sessions["s"].frame_index
    state = _through_snapshot(src.export_state("s"))
    dst = _runner(dtype)
    dst.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, state.scene, restore=state)]))
    undisturbed = _run(src, first, 12, np.random.default_rng(2))
    migrated = _run(dst, first, 12, np.random.default_rng(2))
    assert all(np.array_equal(a, b) for a, b in zip(undisturbed, migrated, strict=True))


def test_without_the_family_state_the_restore_is_only_close() -> None:
    # what a snapshot without one gives: the cache rebuilt from rounded frames, the anchor on
    # the newest frame; the family state is what makes the test above exact
    src = _runner()
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, SCENE)]))
    _run(src, 0, 6, np.random.default_rng(0))
    state = src.export_state("s")
    state.family_state = {}
    dst = _runner()
    dst.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, SCENE, restore=state)]))
    a = _run(src, 6, 4, np.random.default_rng(2))
    b = _run(dst, 6, 4, np.random.default_rng(2))
    assert not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_family_state_that_does_not_fit_the_model_fails_that_session_only() -> None:
    src = _runner()
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, SCENE)]))
    _run(src, 0, 3, np.random.default_rng(0))
    state = src.export_state("s")
    other = make_runner(tiny_config(depth=3))
    out = other.execute(StepPlan(new_sessions=[
        SessionSpec("s", BUCKET, SEED, SCENE, restore=state), SessionSpec("t", BUCKET, 1, SCENE),
    ]))
    assert "default.kv: expected float32" in out.errors["s"] and "t" not in out.errors
    assert "s" not in other.sessions and "t" in other.sessions
    small = make_runner(tiny_config(buckets=(16, 32), base_bucket=16))  # another frame size
    assert "anchor" in state.family_state
    out = small.execute(StepPlan(new_sessions=[SessionSpec("s", 16, SEED, SCENE, restore=state)]))
    assert "s" in out.errors
