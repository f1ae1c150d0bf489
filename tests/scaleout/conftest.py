"""Fixtures for the scale-out tests: a real redis-server on a free loopback port (as
tests/directory/conftest.py starts one), the model weights of tests/server, and a session
handed over by a drain (``hand_over``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.polling import until
from tests.scaleout.harness import Cluster
from tests.server.conftest import model_weights  # noqa: F401  (a fixture, re-exported)
from tests.server.harness import recv_type, send
from worldserve.clients.local import RedisProcess
from worldserve.protocol import Start, Started
from worldserve.server.cluster.directory import SessionState
from worldserve.session.session import hash_token


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


@dataclass(frozen=True)
class Moved:
    """A session a drain handed from its worker to the other one, its client not yet back."""

    session_id: str
    token: str
    target: int  # the worker it was handed to
    target_ws: str  # that worker's WebSocket URL


HandOver = Callable[[Cluster], Awaitable[Moved]]


@pytest.fixture
def hand_over() -> HandOver:
    """Place and start a session in a two-worker cluster, wait until the directory holds its
    token's hash and a checkpoint, close its socket, drain its worker and wait until the
    session is handed to the other one."""

    async def run(c: Cluster) -> Moved:
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            placed = await resp.json()
        sid = placed["session_id"]
        async with c.http.ws_connect(placed["url"]) as ws:
            await send(ws, Start(session_id=sid, fps=30.0, codec="raw"))
            started = await recv_type(ws, Started)
            assert isinstance(started, Started)

            async def recorded() -> bool:
                rec = await c.directory.get_session(sid)
                return (rec is not None and rec.token_hash == hash_token(started.token).hex()
                        and await c.directory.get_snapshot(sid) is not None)

            await until(recorded, what="the token's hash and a checkpoint in the directory")
        source = c.index_of(placed["worker_id"])  # the socket closed: the session is detached
        await c.drain(source)
        target = 1 - source

        async def handed_over() -> bool:
            rec = await c.directory.get_session(sid)
            return rec is not None and rec.state is SessionState.MIGRATING and await c.holder(sid) == target

        await until(handed_over, what="the session handed to the other worker")
        return Moved(sid, started.token, target, c.worker_url(target).replace("http", "ws") + "/v1/ws")

    return run
