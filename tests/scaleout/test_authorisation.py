"""A resume on another worker is authorised against the directory's record (the token's
hash) before the worker fetches or decodes the session's hand-off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.scaleout.conftest import HandOver
from tests.scaleout.harness import cluster
from tests.server.harness import recv_type, send
from worldserve.protocol import Error, Resume, Resumed
from worldserve.server.cluster.signing import verify
from worldserve.session.handoff import decode


async def test_a_wrong_token_fetches_no_handoff_on_the_worker_a_session_moved_to(hand_over: HandOver) -> None:
    async with cluster(2) as c:
        moved = await hand_over(c)
        sid = moved.session_id
        fetched: list[str] = []
        get_snapshot = c.directory.get_snapshot

        async def counting(session_id: str) -> Any:
            fetched.append(session_id)
            return await get_snapshot(session_id)

        c.directory.get_snapshot = counting  # type: ignore[method-assign]
        for _ in range(5):
            async with c.http.ws_connect(moved.target_ws) as thief:
                await send(thief, Resume(sid, "not-the-token-at-all", 1))
                err = await recv_type(thief, Error)
                assert isinstance(err, Error) and err.code == "bad_token"
        assert fetched == []
        async with c.http.ws_connect(moved.target_ws) as owner:
            await send(owner, Resume(sid, moved.token, 1))
            assert isinstance(await recv_type(owner, Resumed), Resumed)
        assert fetched == [sid]


async def test_a_migrated_session_goes_on_with_the_input_budget_it_had_left_not_a_full_one(hand_over: HandOver) -> None:
    from worldserve.protocol import Ack, Prompt

    async with cluster(2, input_burst=2) as c:
        moved = await hand_over(c)
        h = decode(verify(None, moved.session_id, await c.directory.get_snapshot(moved.session_id) or b""))
        await c.directory.put_snapshot(moved.session_id, replace(h, inputs=0.0).encode(), 60.0)  # all spent
        async with c.http.ws_connect(moved.target_ws) as ws:
            await send(ws, Resume(moved.session_id, moved.token, 1))
            assert isinstance(await recv_type(ws, Resumed), Resumed)
            await send(ws, Prompt("a burst it already had", id=1))
            got = await recv_type(ws, (Ack, Error))  # type: ignore[arg-type]
            assert isinstance(got, Error) and got.code == "rate_limited", got
