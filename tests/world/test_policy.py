from __future__ import annotations

import numpy as np
import pytest

from worldserve.session.plan import ACTION_DIM
from worldserve.world import POLICIES
from worldserve.world.policy import resolve_policy


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policies_emit_valid_action_vectors(name: str) -> None:
    actions = POLICIES[name](1000, np.random.default_rng(2))
    assert actions.shape == (1000, ACTION_DIM) and actions.dtype == np.float32
    assert set(np.unique(actions[:, :4])) <= {0.0, 1.0}
    assert np.abs(actions[:, 4:]).max() <= 1.0
    assert (~actions.any(axis=1)).any(), "some idle frames"
    assert actions[:, :4].any()
    if name != "keys":
        assert np.abs(actions[:, 4:]).max() > 0.2
    else:
        assert not actions[:, 4:].any()


def test_policies_are_deterministic_given_the_rng() -> None:
    for policy in POLICIES.values():
        a = policy(100, np.random.default_rng(9))
        b = policy(100, np.random.default_rng(9))
        assert np.array_equal(a, b)


def test_unknown_policy_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown policy 'walk'"):
        resolve_policy("walk")


def test_calm_policy_stands_still_far_more_than_mixed() -> None:
    rng = np.random.default_rng(3)
    still = lambda a: float((~a.any(axis=1)).mean())  # noqa: E731
    calm = np.mean([still(POLICIES["calm"](200, rng)) for _ in range(20)])
    mixed = np.mean([still(POLICIES["mixed"](200, rng)) for _ in range(20)])
    assert calm > 0.45 and calm > 3 * mixed
