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
