"""Warm-up timings for the cost model: a runner that pads batches to recorded shapes is
predicted at the shape it runs as, not between two measured sizes."""

from __future__ import annotations

from worldserve.session.costmodel import CostModel
from worldserve.session.fake_runner import FakeRunner, LinearCost
from worldserve.session.warmup import ladder_steps, warm_up

LINEAR = LinearCost({64: (0.010, 0.004)}, 4)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class PaddingRunner(FakeRunner):
    """Runs a batch of n as one of the next power of two, and says so."""

    def __init__(self) -> None:
        super().__init__(buckets=(64,), cost=lambda b, s, n: LINEAR(b, s, _pow2(n)))

    def batch_run_as(self, bucket: int, steps: int, size: int) -> int:
        return _pow2(size)


def test_a_padding_runner_is_predicted_at_the_size_it_runs_as() -> None:
    timings = warm_up(PaddingRunner(), (64,), (2, 4), (1, 2, 4, 8))
    cost = CostModel(timings)
    for steps in (2, 4):
        for n, as_n in ((3, 4), (5, 8), (7, 8)):
            assert cost.predict(64, steps, n) == LINEAR(64, steps, as_n)
    sizes = sorted({t.size for t in timings if t.steps == 4})
    assert sizes == list(range(1, 9))


def test_a_runner_that_does_not_pad_is_interpolated_as_before() -> None:
    timings = warm_up(FakeRunner(buckets=(64,), cost=LINEAR), (64,), (4,), (1, 2, 4, 8))
    assert sorted(t.size for t in timings) == [1, 2, 4, 8]
    cost = CostModel(timings)
    assert abs(cost.predict(64, 4, 3) - LINEAR(64, 4, 3)) < 1e-12  # linear: exact in between


def test_warm_up_visits_only_the_step_counts_a_model_was_trained_for() -> None:
    assert ladder_steps(4, 2) == (2, 3, 4)
    assert ladder_steps(4, 2, (4,)) == (4,)
    assert ladder_steps(4, 1, (4, 2)) == (2, 4)
