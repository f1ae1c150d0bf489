"""Warm-up: run each shape the scheduler will use once, and time it for the cost model.

Only the shapes asked for are warmed: the server passes its served buckets x the ladder's
step counts x the configured batch sizes; ``ModelRunner.warmup`` passes every step count the
model knows. Torch-free, so the model and the server share it. It drives the runner through its
public ``execute`` with throwaway sessions, so any ``Runner`` works, and it must run on
the model thread. The first run of a shape pays one-off costs; the second is timed.
"""

from __future__ import annotations

import numpy as np

from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    BatchTiming,
    ChunkWork,
    Runner,
    SessionSpec,
    StepPlan,
)


def warmup_shapes(
    buckets: tuple[int, ...], steps: tuple[int, ...], batch_sizes: tuple[int, ...]
) -> list[tuple[int, int, int]]:
    """(bucket, steps, batch size) for every shape to warm, sorted."""
    return sorted({(b, s, n) for b in buckets for s in steps for n in batch_sizes})


def ladder_steps(max_steps: int, min_steps: int) -> tuple[int, ...]:
    """The step counts a session's ladder visits: max_steps down to min_steps."""
    lo = max(1, min(min_steps, max_steps))
    return tuple(range(lo, max_steps + 1))


def warm_up(
    runner: Runner,
    buckets: tuple[int, ...],
    steps: tuple[int, ...],
    batch_sizes: tuple[int, ...],
) -> list[BatchTiming]:
    """Run and time every shape; raises if the runner fails one (the server is not ready)."""
    timings: list[BatchTiming] = []
    fpc = runner.frames_per_chunk
    actions = np.zeros((fpc, ACTION_DIM), np.float32)
    for bucket in buckets:
        # anchored on a blank frame: nothing to render, and the first chunk is already
        # past the sink, as a served session's are
        blank = np.zeros((bucket, bucket, 3), np.uint8)
        for size in sorted(set(batch_sizes)):
            ids = [f"__warmup_{bucket}_{size}_{i}" for i in range(size)]
            opened = runner.execute(
                StepPlan(new_sessions=[SessionSpec(sid, bucket, seed=i, scene="", observation=blank)
                                       for i, sid in enumerate(ids)])
            )
            _check(opened.errors)
            block = 0
            try:
                for n in sorted(set(steps)):
                    for _ in range(2):
                        items = [ChunkWork(sid, block, actions) for sid in ids]
                        out = runner.execute(StepPlan(batches=[Batch(bucket, n, items)]))
                        _check(out.errors)
                        block += 1
                    timings.extend(out.timings)  # the second run's
            finally:
                runner.execute(StepPlan(freed=ids))
    return timings


def _check(errors: dict[str, str]) -> None:
    if errors:
        sid, msg = next(iter(errors.items()))
        raise RuntimeError(f"warm-up failed for {sid}: {msg}")
