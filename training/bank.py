"""Training on the model's own long rollouts (``training/train.py``, ``--bank-share``).

Self-rollout steps train on frames that follow 16 frames of the model's own making, started
from the renderer's frame. A session runs for thousands: after the camera has moved one view
width, every pixel in view is the model's own, and whatever it draws then (streaks, flat
blocks per token) is what it conditions on next. Training never saw that regime, and no
renderer frame is a valid target for it: the model's terrain is not the renderer's.

``RolloutBank`` keeps ``slots`` sessions of the serving path itself (``ModelRunner`` over the
EMA weights, the weights that are exported and served) running across training steps, each
beside the world it started from, driven by the same actions, for a random life of up to
``max_life`` frames before it starts over elsewhere. Every training step advances them by a
few frames; a bank step trains on each session's newest frames as the context, with two
targets that stay valid however far the session has drifted:

- where the renderer's frame is only its previous frame moved by the camera (static ground
  already in view, ``carry_mask``), the model's own previous frame moved the same way: carry
  what you have drawn, exactly;
- everywhere, the critic (``training/critic.py``): look like the world's frames of this scene.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import Batch, ChunkWork, SessionSpec, StepPlan
from worldserve.world import World, mixed_policy, sample_scene

BANK_SEED_BASE = 900_000  # worlds of the bank; training's pool and the bench's seeds lie elsewhere


@dataclass
class _Slot:
    sid: str
    world: World
    actions: np.ndarray  # (life, A): the whole life's script
    scene: np.ndarray  # (S,) the scene vector, fixed for the life
    sink: np.ndarray  # the observation the session started from (the cache's sink frame)
    own: deque = field(default_factory=deque)  # the model's newest frames
    truth: deque = field(default_factory=deque)  # the renderer's, at the same moments
    acts: deque = field(default_factory=deque)
    age: int = 0


class RolloutBank:
    """``slots`` long-running sessions of the model's own rollouts at ``bucket``."""

    def __init__(self, model: WorldModel, slots: int, bucket: int, seq_frames: int, max_life: int,
                 rng: np.random.Generator, map_size: int, warm_frames: int = 0):
        if max_life < seq_frames + 1:
            raise ValueError(f"max_life={max_life} must exceed seq_frames={seq_frames}")
        self.runner = ModelRunner(model, max_sessions=slots)
        self.bucket, self.seq, self.max_life = bucket, seq_frames, max_life
        self.rng, self.map_size = rng, map_size
        self.next_seed = BANK_SEED_BASE + int(rng.integers(0, 10_000))
        self.slots = [self._start(f"bank{i}") for i in range(slots)]
        self.advance(warm_frames)

    def _start(self, sid: str) -> _Slot:
        self.next_seed += 1
        world = World(self.next_seed, sample_scene(self.rng), (self.bucket,), map_size=self.map_size)
        world.reset(world.random_position(self.rng))
        life = int(self.rng.integers(self.seq + 1, self.max_life + 1))
        first = world.render(self.bucket)
        self.runner.execute(StepPlan(new_sessions=[
            SessionSpec(sid, self.bucket, seed=self.next_seed, scene=world.scene.to_prompt(), observation=first)
        ]))
        acts = mixed_policy(life, self.rng).astype(np.float32)
        return _Slot(sid, world, acts, world.scene.to_vector().astype(np.float32), first,
                     deque([first], self.seq), deque([first], self.seq), deque([acts[0]], self.seq))

    def advance(self, frames: int) -> None:
        """Every session ``frames`` frames on, in one batch per frame; a session at the end
        of its life starts over on a new world."""
        for _ in range(frames):
            for i, s in enumerate(self.slots):
                if s.age + 1 >= len(s.actions):
                    self.runner.execute(StepPlan(freed=[s.sid]))
                    self.slots[i] = self._start(s.sid)
            # a session's block index is its age: both start at its first frame
            items = [ChunkWork(s.sid, s.age, s.actions[s.age + 1][None]) for s in self.slots]
            out = self.runner.execute(StepPlan(batches=[Batch(self.bucket, self.runner.max_steps, items)]))
            if out.errors:
                raise RuntimeError(f"rollout bank: {out.errors}")
            got = {r.session_id: r.frames[-1] for r in out.results}
            for s in self.slots:
                s.age += 1
                a = s.actions[s.age]
                s.world.step(a)
                s.own.append(got[s.sid])
                s.truth.append(s.world.render(self.bucket))
                s.acts.append(a)

    def ages(self) -> list[int]:
        return [s.age for s in self.slots]

    def batch(self) -> dict[str, np.ndarray]:
        """A training batch in the far-sink layout: frame 0 the sink (the observation), then
        the newest ``seq_frames - 1`` frames of each session; ``frames``/``prevs`` the
        model's own, ``truth``/``truth_prevs`` the renderer's at the same moments. Sessions
        younger than that are advanced first."""
        while (short := self.seq - min(len(s.own) for s in self.slots)) > 0:
            self.advance(short)  # a life is longer than a sequence: this ends
        n = self.seq - 1
        frames, prevs, truth, truth_prevs, acts = [], [], [], [], []
        for s in self.slots:
            own, tru, act = list(s.own), list(s.truth), list(s.acts)
            zero = np.zeros_like(s.sink)
            frames.append(np.stack([s.sink, *own[-n:]]))
            prevs.append(np.stack([zero, *own[-n - 1 : -1]]))
            truth.append(np.stack([s.sink, *tru[-n:]]))
            truth_prevs.append(np.stack([zero, *tru[-n - 1 : -1]]))
            acts.append(np.stack([np.zeros_like(act[0]), *act[-n:]]))
        scenes = np.stack([np.repeat(s.scene[None], self.seq, 0) for s in self.slots])
        return {
            "frames": np.stack(frames), "prevs": np.stack(prevs), "truth": np.stack(truth),
            "truth_prevs": np.stack(truth_prevs), "actions": np.stack(acts), "scenes": scenes,
            "far": np.array(True),
        }
