"""A few training steps on a tiny config: the loss falls, checkpoints resume, weights export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from model.runner import ModelRunner
from model.train import TrainConfig, export_checkpoint, train
from session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan

TINY = dict(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)


def _config(out: Path, steps: int, rollout_after: int) -> TrainConfig:
    return TrainConfig(
        out=str(out), minutes=10, max_steps=steps, batch=4, seq_frames=5, big_bucket_every=5,
        lr=3e-3, warmup=3, self_rollout_after=rollout_after, self_rollout_share=1.0, worlds=2,
        world_refresh=1000, map_size=256, checkpoint_minutes=60, model=TINY,
    )


def test_a_few_steps_lower_the_loss_then_resume_and_export(tmp_path: Path) -> None:
    report = train(_config(tmp_path, 30, rollout_after=1000), resume=False, export=None)
    assert report["steps"] == 30
    assert report["loss_last_10_this_run"] < 0.8 * report["loss_first_10_this_run"]

    # resume continues at the saved step, on self-rollout steps
    report2 = train(_config(tmp_path, 33, rollout_after=0), resume=True, export=tmp_path / "w")
    assert report2["steps"] == 33 and report2["steps_this_run"] == 3
    assert json.loads((tmp_path / "ckpt.json").read_text())["step"] == 33

    path = export_checkpoint(tmp_path, tmp_path / "again")
    runner = ModelRunner.from_pretrained(path)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 64, seed=0, scene="snowy night")]))
    a = np.zeros((1, ACTION_DIM), np.float32)
    out = runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork("s", 0, a)])]))
    assert not out.errors and out.results[0].frames.shape == (1, 64, 64, 3)
