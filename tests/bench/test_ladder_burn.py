"""worldserve.bench.ladder_burn's figures from a level timeline: how far the ladder fell and how long
after the burn's end every session was back at level 0 for good."""

from __future__ import annotations

import math

from worldserve.bench.ladder_burn import BurnRun


def run(levels: list[tuple[float, int]]) -> BurnRun:
    return BurnRun(t0=0.0, burn_start=5.0, burn_end=15.0, end=30.0, levels=levels)


def test_recovery_counts_from_the_burns_end_to_level_0_for_good() -> None:
    r = run([(0.0, 0), (6.0, 2), (14.0, 4), (15.5, 3), (16.0, 0), (17.0, 1), (18.5, 0), (29.0, 0)])
    assert r.max_level == 4 and r.calm_max_level == 0
    assert r.recover_s == 3.5  # the bounce at 17 s counts: level 0 for good from 18.5 s


def test_a_ladder_that_never_fell_recovers_in_no_time_and_one_still_down_never() -> None:
    assert run([(0.0, 0), (10.0, 0), (20.0, 0)]).recover_s == 0.0
    assert math.isinf(run([(0.0, 0), (10.0, 2), (29.0, 1)]).recover_s)


def test_back_is_the_first_return_to_level_0_after_the_burn() -> None:
    r = run([(0.0, 0), (6.0, 2), (15.5, 2), (16.5, 0), (20.0, 2), (29.0, 2)])
    assert r.back_s == 1.5  # back at 16.5 s, 1.5 s after the burn's end
    assert math.isinf(r.recover_s)  # calm moved them again at 20 s: not back for good
    assert run([(0.0, 0), (15.0, 0), (20.0, 0)]).back_s == 0.0
    assert math.isinf(run([(0.0, 0), (10.0, 2), (29.0, 1)]).back_s)
