"""``bench.quality``'s steering measures: keys (``control_acc``) and the prompt (``scene_ok``),
the same worlds and scripts for every runner of one seed, so that the weights and the same
weights on the world canvas are judged alike."""

from __future__ import annotations

import numpy as np

from tests.model.conftest import make_runner, tiny_config
from worldserve.bench._control import control_rollouts, steering, steering_fields


def test_steering_reads_the_world_s_own_motion_and_untrained_weights_fail_it() -> None:
    runner = make_runner(tiny_config(), max_sessions=2)
    res, by_weather = steering(runner, 32, 2, 6, seed=3, control_episodes=2)
    assert res["control_acc_renderer"] >= 0.9  # the measure reads the world's own motion
    assert res["control_acc"] < res["control_acc_renderer"]  # untrained weights do not follow keys
    assert sum(n for _, _, n in by_weather.values()) > 0
    assert steering_fields(res) == (f"control_acc={res['control_acc']:.3f} "
                                    f"control_acc_judged={res['control_acc_judged']:.3f} "
                                    f"scene_ok={int(res['scene_ok'])}")


def test_one_seed_gives_every_runner_the_same_worlds_and_scripts() -> None:
    runner = make_runner(tiny_config(), max_sessions=2)
    a, wa = control_rollouts(runner, 32, 2, 3, np.random.default_rng([3, 32, 2]))
    b, wb = control_rollouts(runner, 32, 2, 3, np.random.default_rng([3, 32, 2]))
    assert wa == wb and np.array_equal(a.truth, b.truth) and np.array_equal(a.actions, b.actions)
