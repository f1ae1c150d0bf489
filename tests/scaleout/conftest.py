"""Fixtures for the scale-out tests: a real redis-server on a free loopback port (as
tests/directory/conftest.py starts one), and the model weights of tests/server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.conftest import model_weights  # noqa: F401  (a fixture, re-exported)
from worldserve.clients.local import RedisProcess


def _redis() -> RedisProcess:
    try:
        return RedisProcess.start()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc} (run scripts/system-deps.sh)")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """One throwaway redis-server for the session (tests use their own key prefixes)."""
    proc = _redis()
    try:
        yield proc.url
    finally:
        proc.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    """A redis-server of this test's own, which the test may kill."""
    proc = _redis()
    try:
        yield proc
    finally:
        proc.stop()
