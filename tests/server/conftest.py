from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.loop_guard import LoopGuard, loop_guard


@pytest.fixture(autouse=True)
def blockbuster(request: pytest.FixtureRequest) -> Iterator[LoopGuard | None]:
    """Every async test runs with the loop guard on (tests/server/loop_guard.py): a
    blocking call that the server makes on the event loop fails the test, also when the
    server caught the ``BlockingError``."""
    if not inspect.iscoroutinefunction(getattr(request, "function", None)):
        yield None
        return
    with loop_guard() as guard:
        yield guard
        caught = guard.take()
    if caught:
        pytest.fail("blocking calls on the event loop:\n  " + "\n  ".join(caught), pytrace=False)


@pytest.fixture(scope="session")
def model_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained default weights when they are there; else a random-init model saved to
    a temp dir. Its zero-initialised layers (adaLN, heads) get small random values: as
    initialised, the model ignores actions and prompts, and the tests check that those
    change the frames."""
    from worldserve.model.default.weights import DEFAULT_WEIGHTS, config_path

    if DEFAULT_WEIGHTS.exists() and config_path(DEFAULT_WEIGHTS).exists():
        return DEFAULT_WEIGHTS
    from worldserve.model.default.weights import save_random_model

    return save_random_model(tmp_path_factory.mktemp("weights") / "random.safetensors")
