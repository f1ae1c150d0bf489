"""Held-out episodes and the model driven through them: shared by ``bench.quality`` and
``bench.rollout_probe``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import Batch, ChunkWork, SessionSpec, SessionUpdate, StepPlan
from worldserve.training.train import HELD_OUT_SEEDS
from worldserve.world import World, sample_scene


class Driver:
    """Runs many sessions of the runner in lockstep, one batch per frame, at ``steps``
    denoising steps (``--steps``; default the model's full count)."""

    steps: int | None = None

    def __init__(self, runner: ModelRunner, bucket: int):
        self.runner, self.bucket = runner, bucket
        self.ids: list[str] = []
        self.block = 0

    def open(self, anchors: np.ndarray, scenes: list[str], seed: int) -> None:
        self.ids = [f"q{seed}_{i}" for i in range(len(anchors))]
        self.block = 0
        self.runner.execute(StepPlan(new_sessions=[
            SessionSpec(sid, self.bucket, seed=seed + i, scene=scenes[i], observation=anchors[i])
            for i, sid in enumerate(self.ids)
        ]))

    def step(self, actions: np.ndarray) -> np.ndarray:
        """actions (E, A) -> frames (E, H, W, 3)."""
        items = [ChunkWork(sid, self.block, actions[i][None]) for i, sid in enumerate(self.ids)]
        out = self.runner.execute(StepPlan(batches=[Batch(self.bucket, self.steps or self.runner.max_steps, items)]))
        if out.errors:
            raise RuntimeError(f"runner errors: {out.errors}")
        self.block += 1
        by_id = {r.session_id: r.frames[-1] for r in out.results}
        return np.stack([by_id[sid] for sid in self.ids])

    def scene(self, prompts: list[str]) -> None:
        updates = [SessionUpdate(sid, scene=p) for sid, p in zip(self.ids, prompts, strict=True)]
        self.runner.execute(StepPlan(updates=updates))

    def close(self) -> None:
        self.runner.execute(StepPlan(freed=self.ids))


def make_worlds(n: int, bucket: int, rng: np.random.Generator, first_seed: int) -> list[World]:
    seeds = [HELD_OUT_SEEDS[first_seed + i] for i in range(n)]
    worlds = [World(s, sample_scene(rng), (bucket,)) for s in seeds]
    for w in worlds:
        w.reset(w.random_position(rng))
    return worlds


@dataclass
class Rollouts:
    truth: np.ndarray  # (E, T, H, W, 3)
    model: np.ndarray  # (E, T, H, W, 3); frame 0 is the anchor
    actions: np.ndarray  # (E, T, A)
    scenes: list[str] | None = None  # each episode's scene prompt


def rollouts(runner: ModelRunner, bucket: int, worlds: list[World], actions: np.ndarray, seed: int) -> Rollouts:
    """Renderer and model driven by the same ``actions`` (E, T, A), the model anchored on
    the renderer's first frame."""
    episodes, length = actions.shape[:2]
    truth = np.zeros((episodes, length, bucket, bucket, 3), np.uint8)
    for i, w in enumerate(worlds):
        truth[i, 0] = w.render(bucket)
        for t in range(1, length):
            w.step(actions[i, t])
            truth[i, t] = w.render(bucket)
    drv = Driver(runner, bucket)
    drv.open(truth[:, 0], [w.scene.to_prompt() for w in worlds], seed=seed)
    model = truth.copy()
    for t in range(1, length):
        model[:, t] = drv.step(actions[:, t])
    drv.close()
    return Rollouts(truth, model, actions, [w.scene.to_prompt() for w in worlds])
