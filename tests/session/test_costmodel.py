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
