"""Training batches from the procedural world: recorded in this process, or in worker processes.

The world renders on the CPU with numpy. On a GPU the model trains far faster than one
process can record episodes, so ``BatchSource(workers=N)`` runs N recorder processes.
Worker ``i`` makes the batches of steps ``step0 + i, step0 + i + N, ...`` from its own
random stream, and the trainer takes them in step order: a run is reproducible for a given
seed, start step and worker count.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from dataclasses import dataclass

import numpy as np

from worldserve.world import World, record_episode, sample_scene

TRAIN_SEED_BASE = 10_000  # training worlds; the quality bench holds out seeds below 1000

Batch = dict[str, np.ndarray]


class WorldPool:
    """A few live worlds to record short episodes from; slowly refreshed for variety."""

    def __init__(self, n: int, buckets: tuple[int, ...], rng: np.random.Generator, map_size: int,
                 scene_switch_share: float = 0.0, still_share: float = 0.0):
        self.rng, self.buckets, self.map_size = rng, buckets, map_size
        self.scene_switch_share = scene_switch_share
        self.still_share = still_share
        self.next_seed = TRAIN_SEED_BASE + int(rng.integers(0, 1_000_000))
        self.worlds = [self._new() for _ in range(n)]

    def _new(self) -> World:
        self.next_seed += 1
        return World(self.next_seed, sample_scene(self.rng), self.buckets, map_size=self.map_size)

    def refresh(self) -> None:
        self.worlds[int(self.rng.integers(len(self.worlds)))] = self._new()

    def sequences(self, n: int, length: int, bucket: int, far: bool, grounds: bool = False) -> Batch:
        """``n`` sequences of ``length`` frames (frames, prevs, actions, per-frame scenes);
        with ``far`` the sink frame lies well before the rest, as in a long session. In a
        share of them the scene changes part-way, as when a user types a new prompt. With
        ``grounds``, also every frame's ground alone (``grounds``: a world canvas's view)."""
        frames, prevs, acts, scenes, views = [], [], [], [], []
        for _ in range(n):
            world = self.worlds[int(self.rng.integers(len(self.worlds)))]
            if self.rng.random() < 0.1:
                world.set_scene(sample_scene(self.rng))
            gap = int(self.rng.integers(8, 24)) if far else 0
            if far:  # sink = frame 0, the rest from well after it
                idx = [0, *range(gap + 1, gap + length)]
                prev_idx = [-1, *range(gap, gap + length - 1)]
            else:
                idx = list(range(1, length + 1))
                prev_idx = [-1, *range(1, length)]
            switch = None
            if self.rng.random() < self.scene_switch_share:
                switch = (idx[int(self.rng.integers(1, length))], sample_scene(self.rng))
            policy = "calm" if self.rng.random() < self.still_share else "mixed"
            ep = record_episode(world, length + gap + 1, policy, self.rng, buckets=(bucket,), switch=switch,
                                grounds=grounds)
            f, a = ep.frames[bucket], ep.actions
            if ep.grounds is not None:
                views.append(ep.grounds[bucket][idx])
            frames.append(f[idx])
            prevs.append(np.stack([f[j] if j >= 0 else np.zeros_like(f[0]) for j in prev_idx]))
            acts.append(a[idx])
            scenes.append(ep.scenes[idx])
        out = {
            "frames": np.stack(frames), "prevs": np.stack(prevs), "actions": np.stack(acts),
            "scenes": np.stack(scenes), "far": np.array(far),
        }
        if views:
            out["grounds"] = np.stack(views)
        return out


@dataclass(frozen=True)
class DataSpec:
    """What every batch is drawn from; picklable, so worker processes get a copy."""

    buckets: tuple[int, ...]
    sequences: dict[int, int]  # sequences per batch, by bucket (the bigger ones cost more tokens)
    seq_frames: int
    big_bucket_every: int  # every n-th step trains a bigger bucket
    far_sink_share: float
    scene_switch_share: float
    still_share: float
    worlds: int
    map_size: int
    world_refresh: int  # batches between two world refreshes
    canvas_share: float = 0.0  # batches that also carry every frame's ground (canvas references)


class Recorder:
    """Makes the batch of a given step from one random stream."""

    def __init__(self, spec: DataSpec, rng: np.random.Generator):
        self.spec, self.rng, self.made = spec, rng, 0
        self.pool = WorldPool(spec.worlds, spec.buckets, rng, spec.map_size,
                              spec.scene_switch_share, spec.still_share)

    def batch(self, step: int) -> Batch:
        spec, rng = self.spec, self.rng
        if self.made and self.made % spec.world_refresh == 0:
            self.pool.refresh()
        self.made += 1
        big = step % spec.big_bucket_every == spec.big_bucket_every - 1 and len(spec.buckets) > 1
        bucket = spec.buckets[1 + int(rng.integers(len(spec.buckets) - 1))] if big else spec.buckets[0]
        far = bool(rng.random() < spec.far_sink_share)
        grounds = spec.canvas_share > 0 and bool(rng.random() < spec.canvas_share)  # no draw without it
        return self.pool.sequences(spec.sequences[bucket], spec.seq_frames, bucket, far, grounds)


def _record_forever(spec: DataSpec, seed: list[int], first: int, stride: int, out: mp.Queue) -> None:
    rec = Recorder(spec, np.random.default_rng(seed))
    step = first
    while True:
        out.put(rec.batch(step))
        step += stride


class BatchSource:
    """Batches in step order, from this process (``workers=0``) or from worker processes."""

    def __init__(self, spec: DataSpec, seed: int, step0: int, workers: int = 0, prefetch: int = 3):
        self.step0, self.workers = step0, workers
        self._procs: list[mp.process.BaseProcess] = []
        self._queues: list[mp.Queue] = []
        if workers <= 0:
            self._inline: Recorder | None = Recorder(spec, np.random.default_rng([seed, step0]))
            return
        self._inline = None
        ctx = mp.get_context("spawn")  # no fork of a process that holds torch threads or CUDA
        for i in range(workers):
            q: mp.Queue = ctx.Queue(maxsize=prefetch)
            p = ctx.Process(target=_record_forever, args=(spec, [seed, step0, i], step0 + i, workers, q),
                            daemon=True, name=f"recorder-{i}")
            p.start()
            self._queues.append(q)
            self._procs.append(p)

    def batch(self, step: int, timeout: float = 600.0) -> Batch:
        if self._inline is not None:
            return self._inline.batch(step)
        i = (step - self.step0) % self.workers
        while True:
            try:
                return self._queues[i].get(timeout=min(timeout, 10.0))
            except queue.Empty:
                if not self._procs[i].is_alive():
                    raise RuntimeError(f"recorder {i} died (exit code {self._procs[i].exitcode})") from None
                timeout -= 10.0
                if timeout <= 0:
                    raise TimeoutError(f"recorder {i} made no batch in time") from None

    def close(self) -> None:
        for p in self._procs:
            p.terminate()
        for p in self._procs:
            p.join(timeout=5)
        for q in self._queues:
            q.cancel_join_thread()
            q.close()
        self._procs, self._queues = [], []

    def __enter__(self) -> BatchSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
