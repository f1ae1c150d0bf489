"""A resume on another worker is authorised against the directory's record (the token's
hash) before the worker fetches or decodes the session's hand-off."""

from __future__ import annotations

from typing import Any

from tests.polling import until
from tests.scaleout.harness import cluster
from tests.server.harness import recv_type, send
from worldserve.protocol import Error, Resume, Resumed, Start, Started
from worldserve.server.cluster.directory import SessionState
from worldserve.session.session import hash_token


async def test_a_wrong_token_fetches_no_handoff_on_the_worker_a_session_moved_to() -> None:
    async with cluster(2) as c:
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            placed = await resp.json()
        sid = placed["session_id"]
        async with c.http.ws_connect(placed["url"]) as ws:
            await send(ws, Start(session_id=sid, fps=30.0, codec="raw"))
            started = await recv_type(ws, Started)
            assert isinstance(started, Started)

            async def hashed() -> bool:
                rec = await c.directory.get_session(sid)
                return rec is not None and rec.token_hash == hash_token(started.token).hex()

            await until(hashed, what="the record holds the token's hash")
        source = c.index_of(placed["worker_id"])  # the socket closed: the session is detached
        await c.drain(source)
        target = 1 - source

        async def handed_over() -> bool:
            rec = await c.directory.get_session(sid)
            return rec is not None and rec.state is SessionState.MIGRATING and await c.holder(sid) == target

        await until(handed_over, what="the session handed to the other worker")
        fetched: list[str] = []
        get_snapshot = c.directory.get_snapshot

        async def counting(session_id: str) -> Any:
            fetched.append(session_id)
            return await get_snapshot(session_id)

        c.directory.get_snapshot = counting  # type: ignore[method-assign]
        url = c.worker_url(target).replace("http", "ws") + "/v1/ws"
        for _ in range(5):
            async with c.http.ws_connect(url) as thief:
                await send(thief, Resume(sid, "not-the-token-at-all", 1))
                err = await recv_type(thief, Error)
                assert isinstance(err, Error) and err.code == "bad_token"
        assert fetched == []
        async with c.http.ws_connect(url) as owner:
            await send(owner, Resume(sid, started.token, 1))
            assert isinstance(await recv_type(owner, Resumed), Resumed)
        assert fetched == [sid]
