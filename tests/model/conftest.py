from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, StepPlan


def tiny_config(**kw: object) -> ModelConfig:
    base: dict[str, object] = dict(
        buckets=(32, 64), base_bucket=32, patch=16, width=32, depth=2, heads=2,
        time_rope_dims=4, sink_frames=1, window_frames=3, scene_dim=4, motion_radius=2,
    )  # every other switch as it ships
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def randomized(cfg: ModelConfig, seed: int = 0) -> WorldModel:
    """A model whose every weight is random (the real init zeroes adaLN and heads, which
    would make many checks pass trivially)."""
    torch.manual_seed(seed)
    model = WorldModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def scene_encoder_for(cfg: ModelConfig):
    def encode(text: str) -> np.ndarray:
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little"))
        return rng.standard_normal(cfg.scene_dim).astype(np.float32)

    return encode


def make_runner(cfg: ModelConfig | None = None, seed: int = 0, **kw: object) -> ModelRunner:
    cfg = cfg or tiny_config()
    return ModelRunner(randomized(cfg, seed), scene_encoder=scene_encoder_for(cfg), **kw)  # type: ignore[arg-type]


@pytest.fixture
def cfg() -> ModelConfig:
    return tiny_config()


def key_action(k: int) -> np.ndarray:
    """One chunk's action (1, ACTION_DIM) with control ``k`` held."""
    a = np.zeros((1, ACTION_DIM), np.float32)
    a[0, k] = 1.0
    return a


def run_chunks(runner: ModelRunner, first: int, actions: list[np.ndarray], sid: str = "s", bucket: int = 64,
               steps: int = 2) -> list[np.ndarray]:
    """Session ``sid``'s chunks from block ``first``, one a plan, one per action; each chunk's last frame."""
    frames = []
    for i, a in enumerate(actions):
        out = runner.execute(StepPlan(batches=[Batch(bucket, steps, [ChunkWork(sid, first + i, a)])]))
        assert not out.errors, out.errors
        frames.append(out.results[0].frames[-1])
    return frames
