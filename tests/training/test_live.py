"""The live stage (``training/live.py``): state channels from the world's own actors and
weather, a few steps that train only the state's parts and the head, and a small checkpoint
that resumes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from worldserve.model.default.reference.live.channels import AXES, CLOUD, STATE_CHANNELS
from worldserve.training.live import LiveConfig, build, load_live, train
from worldserve.training.live_data import LivePool, world_state_channels
from worldserve.world import World


def test_the_state_channels_show_the_world_s_actors_where_they_are() -> None:
    world = World(10_001, "a grassy meadow, cloudy", (64,), map_size=256)
    actors = world.state.actors
    world.reset(tuple(actors.pos[0]))  # the camera over an actor
    ch = world_state_channels(world, 64)
    kind = int(world.state.actors.kind[0])
    assert ch.shape == (STATE_CHANNELS, 64, 64)
    assert ch[kind * AXES, 30:34, 30:34].max() > 0.5  # the actor under the view's centre
    assert 0.0 <= ch[CLOUD].min() and ch[CLOUD].max() <= 1.0
    pool = LivePool(1, np.random.default_rng(0), 256, actor_share=1.0, still_share=0.0, world_refresh=100)
    batch = pool.batch(2, 3)
    assert batch["states"].shape == (2, 3, STATE_CHANNELS, 64, 64) and batch["grounds"].shape == batch["frames"].shape


def test_a_few_steps_train_the_state_s_parts_then_resume_from_a_small_checkpoint(tmp_path: Path) -> None:
    lc = LiveConfig(out=str(tmp_path / "live"), minutes=5, max_steps=2, batch=1, seq_frames=3, worlds=1,
                    map_size=256, checkpoint_minutes=60, warmup=1)
    train(lc, resume=False, export=None)
    ckpt = tmp_path / "live" / "ckpt.safetensors"
    assert ckpt.stat().st_size < 16e6  # the trained parts only
    _, _, base = build(lc)
    live = load_live(lc.out)
    moved = {n for (n, p), q in zip(live.named_parameters(), base.parameters(), strict=True) if not torch.equal(p, q)}
    assert any(n.startswith("state_heads.") for n in moved)
    assert any(n.startswith("state_basis_heads.") for n in moved)  # the learned shapes train too
    assert all(n.startswith(lc.train_only) for n in moved)  # the rest is the served weights
    report = train(LiveConfig(**{**lc.__dict__, "max_steps": 3}), resume=True, export=tmp_path / "export" / "default")
    assert report["steps"] == 3 and report["steps_this_run"] == 1
    assert (tmp_path / "export" / "default.safetensors").exists()
