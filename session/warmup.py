"""Warm-up: run each shape the scheduler will use once, and time it for the cost model.

Only the shapes asked for are warmed: the server passes its served buckets x the ladder's
step counts x the configured batch sizes; ``ModelRunner.warmup`` passes every step count the
model knows. Torch-free, so the model and the server share it. It drives the runner through its
public ``execute`` with throwaway sessions, so any ``Runner`` works, and it must run on
the model thread. The first run of a shape pays one-off costs; the second is timed. A runner
that pads batches to a few recorded shapes (``batch_run_as``: the default model's graphs and
traces run a batch in the smallest one recorded that holds it) gets every unwarmed size up to
the largest timed as the size it runs as, so the cost model does not predict a batch of 3
cheaper than the 4 it costs.
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


def ladder_steps(max_steps: int, min_steps: int, trained: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The step counts a session's ladder visits: max_steps down to min_steps, only the ``trained``
    ones where the runner names them (``RunnerInfo.step_counts``)."""
    lo = max(1, min(min_steps, max_steps))
    return tuple(n for n in range(lo, max_steps + 1) if not trained or n in trained or n == max_steps)


def warm_up(
    runner: Runner,
    buckets: tuple[int, ...],
    steps: tuple[int, ...],
    batch_sizes: tuple[int, ...],
) -> list[BatchTiming]:
    """Run and time every shape; raises if the runner fails one (the server is not ready).
    A runner with ``prepare_shapes`` is told every shape first (the default model loads its
    CPU traces from its trace cache then, and records the others in child processes)."""
    prepare = getattr(runner, "prepare_shapes", None)
    if prepare is not None:
        prepare(warmup_shapes(buckets, steps, batch_sizes))
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
    return timings + padded_timings(runner, timings, max(batch_sizes))


def padded_timings(runner: Runner, timings: list[BatchTiming], largest: int) -> list[BatchTiming]:
    """For a runner that pads batches (``batch_run_as``), each unwarmed size up to ``largest``
    timed as the warmed size it runs as: a batch of 3 padded to 4 costs what 4 does, where
    interpolating between 2 and 4 would predict less."""
    run_as = runner.batch_run_as  # the identity where a runner does not pad
    measured = {(t.bucket, t.steps, t.size): t for t in timings}
    out: list[BatchTiming] = []
    for bucket, steps in sorted({(b, s) for b, s, _ in measured}):
        for n in range(1, largest + 1):
            padded = measured.get((bucket, steps, run_as(bucket, steps, n)))
            if (bucket, steps, n) not in measured and padded is not None:
                out.append(BatchTiming(bucket, steps, n, padded.seconds))
    return out


def _check(errors: dict[str, str]) -> None:
    if errors:
        sid, msg = next(iter(errors.items()))
        raise RuntimeError(f"warm-up failed for {sid}: {msg}")
