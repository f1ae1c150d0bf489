"""Training batches: in-process or from recorder processes, in step order, reproducible."""

from __future__ import annotations

import numpy as np

from worldserve.training.data import BatchSource, DataSpec

SPEC = DataSpec(
    buckets=(64, 128), sequences={64: 3, 128: 1}, seq_frames=4, big_bucket_every=3,
    far_sink_share=0.5, scene_switch_share=0.25, still_share=0.25, worlds=1, map_size=256,
    world_refresh=2,
)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_batches_follow_the_step_plan() -> None:
    with BatchSource(SPEC, seed=1, step0=0) as src:
        batches = [src.batch(s) for s in range(6)]
    for step, b in enumerate(batches):
        bucket = 128 if step % 3 == 2 else 64
        assert b["frames"].shape == (SPEC.sequences[bucket], 4, bucket, bucket, 3)
        assert b["frames"].dtype == np.uint8 and b["prevs"].shape == b["frames"].shape
        assert b["actions"].shape[:2] == (SPEC.sequences[bucket], 4)
    assert not _same(batches[0], batches[1])  # fresh episodes every step


def test_workers_deliver_in_step_order_and_repeat_for_the_same_seed() -> None:
    runs = []
    for _ in range(2):
        with BatchSource(SPEC, seed=7, step0=10, workers=2) as src:
            runs.append([src.batch(s) for s in range(10, 15)])
            procs = list(src._procs)
        assert all(not p.is_alive() for p in procs)  # closed with the source
    first, second = runs
    assert all(_same(a, b) for a, b in zip(first, second, strict=True))
    for step, b in zip(range(10, 15), first, strict=True):  # the bucket plan holds across workers
        assert b["frames"].shape[2] == (128 if step % 3 == 2 else 64)
    assert not _same(first[0], first[1])  # the two workers draw different streams
