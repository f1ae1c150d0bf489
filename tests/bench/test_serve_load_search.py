"""The serving bench's capacity search finds the largest load that holds, whatever the
limit, in few levels (each level costs ``--seconds`` of wall time)."""

from __future__ import annotations

import pytest

from worldserve.bench.serve_load import largest_held


@pytest.mark.parametrize("capacity", [0, 1, 2, 3, 5, 8, 12, 13, 100, 255, 256, 1000])
async def test_finds_the_largest_load_that_holds(capacity: int) -> None:
    limit = 256
    tried: list[int] = []

    async def holds(n: int) -> bool:
        assert 1 <= n <= limit, n
        tried.append(n)
        return n <= capacity

    assert await largest_held(holds, limit) == min(capacity, limit)
    assert len(tried) == len(set(tried)), f"a level ran twice: {tried}"
    assert len(tried) <= 2 * 9, tried  # doubling to 256, then bisecting


async def test_small_limit_tries_each_level_at_most_once() -> None:
    tried: list[int] = []

    async def holds(n: int) -> bool:
        tried.append(n)
        return True

    assert await largest_held(holds, 12) == 12
    assert tried == [1, 2, 4, 8, 12]


def test_capacity_is_the_largest_batch_that_fits_a_frame_period() -> None:
    from worldserve.bench.serve_load import capacity_sessions

    period = 1 / 24
    assert capacity_sessions({1: 0.020, 2: 0.025, 3: 0.040, 4: 0.045}, period) == 3
    assert capacity_sessions({1: 0.050}, period) == 0


def test_a_miss_is_charged_to_a_slow_batch_or_a_late_start() -> None:
    import numpy as np

    from worldserve.bench.serve_load import _Where
    from worldserve.session.costmodel import CostModel
    from worldserve.session.events import DeadlineMiss, FrameSkipped
    from worldserve.session.plan import Batch, BatchTiming, ChunkWork, StepOutput, StepPlan

    cost = CostModel([BatchTiming(64, 4, n, 0.01 * n) for n in (1, 2, 4)])
    a = np.zeros((1, 6), np.float32)
    w = _Where()
    slow = StepPlan(batches=[Batch(64, 4, [ChunkWork("a", 0, a), ChunkWork("b", 0, a)])])
    w.step(slow, StepOutput(timings=[BatchTiming(64, 4, 2, 0.05)]), 0.051, cost, {2: 0.02})
    w.event(DeadlineMiss("a", 0, 1.0, 1.01))
    on_time = StepPlan(batches=[Batch(64, 4, [ChunkWork("c", 0, a)])])
    w.step(on_time, StepOutput(timings=[BatchTiming(64, 4, 1, 0.01)]), 0.011, cost, {1: 0.01})
    w.event(DeadlineMiss("c", 0, 1.0, 1.01))
    w.event(FrameSkipped("c", 1, 0, 2, 1.0))
    busy, handoff_ms, slow_share, tax, _, causes = w.summary(1.0)
    assert causes == {"slow_batch": 1, "late_start": 1, "skipped": 2}
    assert slow_share == 0.5 and abs(tax - 1.75) < 1e-9 and abs(busy - 0.062) < 1e-9
    assert abs(handoff_ms - 1.0) < 1e-6


def test_capacity_while_the_levels_ran_is_timed_on_both_sides() -> None:
    from worldserve.bench.serve_load import capacity_sessions, during

    period = 1 / 24
    before = {1: 0.020, 2: 0.030, 3: 0.040, 4: 0.050}  # a fast minute: 3 fit
    after = {1: 0.024, 2: 0.036, 3: 0.046}  # a slow one: 2 fit, and 4 was never timed
    mean = during(before, after)
    assert mean == pytest.approx({1: 0.022, 2: 0.033, 3: 0.043})
    assert capacity_sessions(mean, period) == 2
    # a size only one side timed says nothing of the other side's minute
    assert capacity_sessions(during({1: 0.02, 2: 0.03}, {1: 0.02}), period) == 1


def test_overhead_is_the_median_over_alternating_rounds() -> None:
    from worldserve.bench.serve_load import overhead_rounds

    # the second round ran on a slow minute for the engine only: the median ignores it
    assert overhead_rounds([98.0, 80.0, 97.0], [100.0, 100.0, 100.0]) == pytest.approx(0.03)
    assert overhead_rounds([100.0], [100.0]) == 0.0
