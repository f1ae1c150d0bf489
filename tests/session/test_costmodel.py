"""Cost model predictions, learning and drift; predicted load."""

from __future__ import annotations

import pytest

from worldserve.session.costmodel import CostModel, Demand, Load
from worldserve.session.plan import BatchTiming


def model(**kw: float) -> CostModel:
    # bucket 64, 4 steps: 10 ms + 2 ms per chunk, measured at 1, 2, 4, 8
    return CostModel([BatchTiming(64, 4, n, 0.010 + 0.002 * n) for n in (1, 2, 4, 8)], **kw)


def test_measured_sizes_are_predicted_as_measured() -> None:
    assert model().predict(64, 4, 4) == pytest.approx(0.018)


def test_unmeasured_sizes_are_interpolated_and_extrapolated_linearly() -> None:
    cm = model()
    assert cm.predict(64, 4, 3) == pytest.approx(0.016)
    assert cm.predict(64, 4, 16) == pytest.approx(0.042)


def test_a_single_measurement_is_a_floor_below_and_linear_above() -> None:
    cm = CostModel([BatchTiming(64, 4, 4, 0.020)])
    assert cm.predict(64, 4, 2) == pytest.approx(0.020)
    assert cm.predict(64, 4, 8) == pytest.approx(0.040)


def test_unmeasured_steps_scale_from_the_nearest_measured_count() -> None:
    cm = model()
    assert cm.predict(64, 2, 1) == pytest.approx(0.012 * 3 / 5)


def test_a_model_whose_cost_does_not_fall_with_steps_is_predicted_at_the_measured_cost() -> None:
    # Rolling Forcing: one window forward a tick whatever the step count
    assert model(steps_cost=False).predict(64, 2, 1) == pytest.approx(0.012)
    assert model(steps_cost=False).predict(64, 6, 8) == pytest.approx(0.026)


def test_an_unmeasured_bucket_is_an_error_naming_the_measured_ones() -> None:
    with pytest.raises(KeyError, match=r"bucket 128.*\[64\]"):
        model().predict(128, 4, 1)


def test_real_times_move_every_prediction_by_an_ewma_scale() -> None:
    cm = model(alpha=0.5)
    for _ in range(30):
        cm.observe(BatchTiming(64, 4, 1, 0.012 * 1.5))
    assert cm.scale == pytest.approx(1.5, rel=1e-3)
    assert cm.predict(64, 2, 8) == pytest.approx(1.5 * 0.026 * 3 / 5, rel=1e-3)


def test_one_outlier_does_not_swing_the_scale() -> None:
    cm = model(alpha=0.2)
    cm.observe(BatchTiming(64, 4, 1, 0.012 * 50))  # a GC pause
    assert cm.scale == pytest.approx(2**0.2)


def test_drift_is_reported_only_beyond_the_threshold() -> None:
    cm = model(drift_threshold=0.25)
    assert cm.observe(BatchTiming(64, 4, 1, 0.012 * 1.2)) is None
    drift = cm.observe(BatchTiming(64, 4, 2, 0.5))
    assert drift is not None and drift.size == 2 and drift.ratio > 1.25
    assert cm.drifts == 1


def test_load_batches_demands_that_share_bucket_steps_and_period() -> None:
    cm = model()
    load = Load(cm, max_batch=4)
    d = Demand(64, 4, 0.05)
    for _ in range(6):
        load.add(d)
    # 6 chunks every 50 ms, batches of at most 4: one of 4 (18 ms) and one of 2 (14 ms)
    assert load.utilisation() == pytest.approx((0.018 + 0.014) / 0.05)
    other = Demand(64, 4, 0.1)
    assert load.with_change(d, other) == pytest.approx((0.018 + 0.012) / 0.05 + 0.012 / 0.1)
    assert load.utilisation() == pytest.approx((0.018 + 0.014) / 0.05)  # unchanged
    assert len(load) == 6


def test_load_counts_fewer_steps_in_the_batch_at_more_steps_where_that_costs_less() -> None:
    cm = model()  # 3 steps scale from 4 by 4/5: 8 ms + 1.6 ms per chunk
    load = Load(cm, max_batch=8)
    full, fewer = Demand(64, 4, 0.05), Demand(64, 3, 0.05)
    for _ in range(3):
        load.add(full)
    load.add(fewer)
    # the 3-step chunk joins the batch of 3 at 4 steps for 2 ms, not a batch of its own for 9.6
    assert load.utilisation() == pytest.approx((0.010 + 0.002 * 4) / 0.05)
    # a session cut to fewer steps saves nothing while others of its clock stay at full steps
    assert load.with_change(full, fewer) == pytest.approx(load.utilisation())
    # all of them at 3 steps: one batch at 3 steps
    assert load.with_changes([full] * 3, [fewer] * 3) == pytest.approx(0.8 * (0.010 + 0.002 * 4) / 0.05)
    # another clock, or another bucket's batch, is not joined
    slow = Load(cm, max_batch=8)
    slow.add(full)
    slow.add(Demand(64, 3, 0.1))
    assert slow.utilisation() == pytest.approx(0.012 / 0.05 + 0.8 * 0.012 / 0.1)
