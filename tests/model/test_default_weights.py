"""The committed default model loads and generates frames that follow the world's look."""

from __future__ import annotations

import json

import numpy as np

from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS, config_path
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan
from worldserve.world import World, parse_prompt, start_frame


def test_default_weights_are_committed_small_and_load() -> None:
    assert DEFAULT_WEIGHTS.exists(), f"missing {DEFAULT_WEIGHTS}: train with `python -m training.train`"
    assert DEFAULT_WEIGHTS.stat().st_size < 30 * 2**20
    assert json.loads(config_path(DEFAULT_WEIGHTS).read_text())["buckets"]


def test_default_model_generates_frames_at_every_bucket() -> None:
    runner = ModelRunner.from_pretrained()
    for bucket in runner.buckets:
        world = World(3, parse_prompt("grassland day"), (bucket,), map_size=256)
        anchor = world.render(bucket)
        sid = f"s{bucket}"
        runner.execute(StepPlan(new_sessions=[
            SessionSpec(sid, bucket, seed=0, scene="grassland day", observation=anchor)
        ]))
        a = np.zeros((1, ACTION_DIM), np.float32)
        a[0, 3] = 1.0  # right
        frames = []
        for block in range(4):
            out = runner.execute(StepPlan(batches=[Batch(bucket, runner.max_steps, [ChunkWork(sid, block, a)])]))
            assert not out.errors
            frames.append(out.results[0].frames[-1])
        assert frames[-1].shape == (bucket, bucket, 3)
        # a trained model stays near the anchored scene over a few frames (random weights do not)
        err = np.abs(frames[0].astype(np.float32) - anchor.astype(np.float32)).mean()
        assert err < 40, f"bucket {bucket}: first frame is {err:.1f} levels from the anchor"


def test_a_session_without_an_observation_starts_from_the_world_view() -> None:
    scene, seed, bucket = "snowy forest night", 7, 64
    start = start_frame(scene, seed, bucket)
    a = np.zeros((1, ACTION_DIM), np.float32)
    firsts = {}
    for name, runner in (
        ("world", ModelRunner.from_pretrained()),
        ("none", ModelRunner.from_pretrained(start_frame=None)),
    ):
        runner.execute(StepPlan(new_sessions=[SessionSpec("s", bucket, seed=seed, scene=scene)]))
        out = runner.execute(StepPlan(batches=[Batch(bucket, runner.max_steps, [ChunkWork("s", 0, a)])]))
        assert not out.errors
        firsts[name] = np.abs(out.results[0].frames[-1].astype(np.float32) - start.astype(np.float32)).mean()
    # same seed, same place: the first frame continues the rendered view; from nothing it does not
    assert firsts["world"] < 20 and firsts["world"] < 0.5 * firsts["none"], firsts
    # the seed picks the place: two seeds, two views
    assert not np.array_equal(start, start_frame(scene, seed + 1, bucket))
