"""Quotas per client (server/quotas.py): a rate of new sessions and a count held, by
address and by API key; and the idle timeout and maximum age of a session."""

from __future__ import annotations

import pytest

from tests.polling import until
from tests.server.harness import recv, recv_type, send, serve
from worldserve.protocol import Action, Ended, Error, Start, Started
from worldserve.server.quotas import MAX_CLIENTS, OverQuota, Quotas, clients


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_client_over_its_start_rate_is_refused_with_the_wait() -> None:
    clock = Clock()
    q = Quotas(rate=1.0, burst=2, clock=clock)
    me = clients("10.0.0.1", None)
    q.take(me)
    q.take(me)
    with pytest.raises(OverQuota) as over:
        q.take(me)
    assert over.value.retry_after_s == pytest.approx(1.0)
    q.take(clients("10.0.0.2", None))  # another address has its own
    clock.now = 1.0
    q.take(me)


def test_a_key_is_charged_across_addresses() -> None:
    q = Quotas(rate=1.0, burst=1, clock=Clock())
    q.take(clients("10.0.0.1", "key-1"))
    with pytest.raises(OverQuota):
        q.take(clients("10.0.0.2", "key-1"))


def test_sessions_held_count_until_they_end() -> None:
    q = Quotas(rate=100.0, burst=100, sessions=2, clock=Clock())
    me = clients("10.0.0.1", None)
    held = {"a", "b"}
    for sid in held:
        q.take(me, held.__contains__)
        q.opened(me, sid)
    with pytest.raises(OverQuota, match="holds 2 sessions"):
        q.take(me, held.__contains__)
    held.discard("a")
    q.take(me, held.__contains__)


def test_the_table_of_clients_stays_bounded() -> None:
    q = Quotas(rate=1.0, burst=1, sessions=1, clock=Clock())
    for i in range(MAX_CLIENTS + 100):
        who = clients(f"addr-{i}", None)
        q.take(who)
        q.opened(who, f"s{i}")
    assert len(q._buckets) <= MAX_CLIENTS and len(q._held) <= MAX_CLIENTS


async def test_a_burst_of_starts_from_one_address_gets_over_quota_and_1013() -> None:
    async with serve(quota_start_burst=2, quota_starts_per_s=0.01, capacity=8) as s:
        for _ in range(2):
            ws = await s.connect()
            await send(ws, Start())
            assert isinstance(await recv(ws), Started)
        ws = await s.connect()
        await send(ws, Start())
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "over_quota" and err.fatal and err.retry_after
        msg = await ws.receive(timeout=10)
        assert ws.close_code == 1013, msg


async def test_an_attached_session_whose_client_sends_nothing_ends_idle() -> None:
    async with serve(idle_timeout_s=0.3, detached_ttl_s=1.0) as s:
        quiet, busy = await s.connect(), await s.connect()
        for ws in (quiet, busy):
            await send(ws, Start(fps=10.0))
            assert isinstance(await recv(ws), Started)
        seq = 0

        async def ended() -> bool:
            nonlocal seq
            seq += 1
            await send(busy, Action(seq, ("forward",)))
            return len(s.service.store) == 1

        await until(ended, what="the quiet session ended")
        got = await recv_type(quiet, Ended, timeout=10)
        assert isinstance(got, Ended) and got.reason == "idle"


async def test_a_session_ends_at_its_maximum_age() -> None:
    async with serve(max_session_age_s=0.3, detached_ttl_s=1.0) as s:
        ws = await s.connect()
        await send(ws, Start(fps=10.0))
        assert isinstance(await recv(ws), Started)
        got = await recv_type(ws, Ended, timeout=10)
        assert isinstance(got, Ended) and got.reason == "max_age"


async def test_a_websocket_from_an_origin_not_allowed_is_refused() -> None:
    async with serve(allowed_origins=frozenset({"https://play.example"})) as s:
        async with s.http.get(s.ws_url, headers={"Origin": "https://evil.example"}) as resp:
            assert resp.status == 403 and (await resp.json())["error"] == "forbidden_origin"
        ws = await s.connect(headers={"Origin": "https://play.example"})
        await send(ws, Start())
        assert isinstance(await recv(ws), Started)
        ws = await s.connect()  # no Origin: not a browser
        await send(ws, Start())
        assert isinstance(await recv(ws), Started)
