"""Router, registration and drain with in-process workers (fake runner) sharing a directory."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.polling import until
from tests.scaleout.harness import Cluster, cluster
from tests.server.harness import frames, recv, recv_type, send, serve
from worldserve.clients.sdk import FrameEvent, SessionEnded, WorldClient
from worldserve.protocol import Ended, Error, Frame, Migrate, Resume, Resumed, Start, Started
from worldserve.server.cluster.directory import MemoryDirectory, SessionState, WorkerState
from worldserve.server.keys import AGENT, SERVICE
from worldserve.session.fake_runner import decode_frame

HANDOVER_TTL = 0.5  # seconds a handed-over session waits for its client (in these tests)


async def frames_until(client: WorldClient, n: int, timeout: float = 10.0) -> list[int]:
    return [(await client.next_frame(timeout)).block_idx for _ in range(n)]


async def test_workers_register_and_the_router_places_on_the_least_loaded() -> None:
    async with cluster(2) as c:
        workers = await c.directory.list_workers()
        assert [(w.worker_id, w.state, w.capacity) for w in workers] == [
            ("w0", WorkerState.SERVING, 4), ("w1", WorkerState.SERVING, 4)
        ]
        placed = []
        for _ in range(4):
            async with c.http.post(f"{c.router_url}/v1/place") as resp:
                assert resp.status == 200
                placed.append((await resp.json())["worker_id"])
        assert sorted(placed) == ["w0", "w0", "w1", "w1"]
        async with c.http.get(f"{c.router_url}/readyz") as resp:
            assert resp.status == 200


async def test_the_router_refuses_with_retry_after_when_every_worker_is_full() -> None:
    async with cluster(1, capacity=1) as c:
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            assert resp.status == 200
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            body = await resp.json()
            assert resp.status == 503 and body["error"] == "no_worker_available"
            assert body["retry_after"] > 0 and "Retry-After" in resp.headers


async def test_a_start_needs_a_reservation_held_by_this_worker() -> None:
    async with cluster(2) as c:
        async with c.http.ws_connect(f"{c.worker_url(0).replace('http', 'ws')}/v1/ws") as ws:
            await send(ws, Start())
            err = await recv_type(ws, Error)
            assert isinstance(err, Error) and err.code == "placement_required" and err.fatal
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            placed = await resp.json()
        other = 1 - c.index_of(placed["worker_id"])
        async with c.http.ws_connect(f"{c.worker_url(other).replace('http', 'ws')}/v1/ws") as ws:
            await send(ws, Start(session_id=placed["session_id"]))
            err = await recv_type(ws, Error)
            assert isinstance(err, Error) and err.code == "placement_required"
            assert "not held by this worker" in err.message
        async with c.http.ws_connect(placed["url"]) as ws:
            await send(ws, Start(session_id=placed["session_id"]))
            started = await recv_type(ws, Started)
            assert isinstance(started, Started) and started.session_id == placed["session_id"]


async def test_a_reservation_is_used_once_and_a_second_start_with_its_id_is_refused() -> None:
    async with cluster(1) as c:
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            placed = await resp.json()
        rec = await c.directory.get_session(placed["session_id"])
        assert rec is not None and rec.state is SessionState.RESERVED
        async with c.http.ws_connect(placed["url"]) as ws:
            await send(ws, Start(session_id=placed["session_id"]))
            assert isinstance(await recv_type(ws, Started), Started)
            async with c.http.ws_connect(placed["url"]) as squatter:
                await send(squatter, Start(session_id=placed["session_id"]))
                err = await recv_type(squatter, Error)
                assert isinstance(err, Error) and err.code == "placement_required"
                assert "used already" in err.message


async def test_an_embedded_worker_needs_no_reservation_and_no_redis() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start(fps=40.0, codec="raw")
        assert await frames_until(client, 3) == [0, 1, 2]
        assert s.app[AGENT].shared is False and s.service.remote is None


@pytest.mark.parametrize("mode", ["push", "pull"])
async def test_drain_moves_sessions_with_no_block_lost_or_repeated(mode: str) -> None:
    async with cluster(2) as c:
        clients = [WorldClient(router=c.router_url, http=c.http) for _ in range(4)]
        try:
            for cl in clients:
                await cl.start(fps=30.0, codec="raw", mode=mode)  # type: ignore[arg-type]
            got: list[list[int]] = [[] for _ in clients]

            async def read(i: int, n: int) -> None:
                cl = clients[i]
                for _ in range(n):
                    ev = await (cl.block(timeout=10) if mode == "pull" and got[i] else cl.next_frame(10))
                    assert ev.image is not None and decode_frame(ev.image)[0] == ev.block_idx
                    got[i].append(ev.block_idx)

            await asyncio.gather(*(read(i, 6) for i in range(4)))
            holders = [await c.holder(cl.session_id or "") for cl in clients]
            assert sorted(holders) == [0, 0, 1, 1]
            await c.drain(0)
            await asyncio.gather(*(read(i, 14) for i in range(4)))
            for i, cl in enumerate(clients):
                assert got[i] == list(range(20)), (i, got[i])
                assert cl.migrations == (1 if holders[i] == 0 else 0)
                assert await c.holder(cl.session_id or "") == 1
                rec = await c.directory.get_session(cl.session_id or "")
                assert rec is not None and rec.state is SessionState.ACTIVE
            await asyncio.wait_for(c.workers[0][AGENT].drained.wait(), 10)
            assert [w.worker_id for w in await c.directory.list_workers()] == ["w1"]
            assert c.workers[0][SERVICE].readiness() == (False, "draining")
        finally:
            for cl in clients:
                await cl.close()


async def test_controls_sent_all_through_a_migration_are_never_refused() -> None:
    # A game sends its controls whenever it likes; once ``migrate`` arrives the client holds
    # them for the target (the source no longer has the session: it would refuse them).
    async with cluster(2) as c:
        clients = [WorldClient(router=c.router_url, http=c.http) for _ in range(2)]
        acting = True

        async def keep_acting(cl: WorldClient) -> None:
            while acting:
                await cl.action(["forward"])
                await asyncio.sleep(0.002)

        async def events(cl: WorldClient, frames: int) -> list[object]:
            got: list[object] = []
            while sum(isinstance(ev, FrameEvent) for ev in got) < frames:
                got.append(await cl.recv(10))
            return got

        try:
            for cl in clients:
                await cl.start(fps=30.0, codec="raw")
            tasks = [asyncio.create_task(keep_acting(cl)) for cl in clients]
            before = await asyncio.gather(*(events(cl, 4) for cl in clients))
            src = await c.holder(clients[0].session_id or "")
            await c.drain(src)
            after = await asyncio.gather(*(events(cl, 12) for cl in clients))
            acting = False
            await asyncio.gather(*tasks)
            assert sum(cl.migrations for cl in clients) >= 1
            errors = [ev for got in (*before, *after) for ev in got if isinstance(ev, Error)]
            assert not errors, errors
        finally:
            acting = False
            for cl in clients:
                await cl.close()


async def test_a_migrate_message_names_the_target_and_the_next_block() -> None:
    async with cluster(2) as c:
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            placed = await resp.json()
        src = c.index_of(placed["worker_id"])
        async with c.http.ws_connect(placed["url"]) as ws:
            await send(ws, Start(session_id=placed["session_id"], fps=30.0, codec="raw"))
            started = await recv_type(ws, Started)
            msgs: list[object] = list(await frames(ws, 3))
            await c.drain(src)
            while not isinstance(msgs[-1] if msgs else None, Ended):
                msgs.append(await recv(ws))
            migrate = next(m for m in msgs if isinstance(m, Migrate))
            last = max(m.block_idx for m in msgs if isinstance(m, Frame))
        assert isinstance(started, Started)
        assert migrate.url == c.worker_url(1 - src).replace("http", "ws") + "/v1/ws"
        assert migrate.worker == f"w{1 - src}" and migrate.block_idx > last
        assert msgs[-1] == Ended(placed["session_id"], "migrated")


async def test_a_closed_session_leaves_the_directory() -> None:
    async with cluster(2) as c:
        async with WorldClient(router=c.router_url, http=c.http) as cl:
            await cl.start(fps=30.0)
            await frames_until(cl, 2)
            sid = cl.session_id or ""

            async def checkpointed() -> bool:
                return await c.directory.get_snapshot(sid) is not None

            await until(checkpointed, what="a checkpoint in the directory")

        async def gone() -> bool:
            return await c.directory.get_session(sid) is None

        await until(gone, what="the closed session leaving the directory")
        assert await c.directory.get_snapshot(sid) is None


async def test_an_embedded_drain_ends_the_sessions_and_finishes() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start(fps=40.0)
        await frames_until(client, 2)
        s.app[AGENT].begin_drain()
        await asyncio.wait_for(s.app[AGENT].drained.wait(), 10)
        with pytest.raises(SessionEnded):
            await frames_until(client, 50)
        assert isinstance(client.ended, Ended) and client.ended.reason == "shutdown"


async def test_admin_drain_needs_the_admin_key() -> None:
    async with cluster(1) as c:
        url = f"{c.worker_url(0)}/admin/drain"
        async with c.http.post(url) as resp:
            assert resp.status == 401
        async with c.http.post(url, headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401
        assert not c.workers[0][SERVICE].draining
    async with serve() as s, aiohttp.ClientSession() as http:
        async with http.post(s.url("/admin/drain")) as resp:
            assert resp.status == 404


async def _abandoned_handover(c: Cluster) -> tuple[int, Started, Migrate]:
    """A session on one worker, drained to the other; its client never resumes there.
    Returns (the target's index, the session's started, the migrate it was sent)."""
    async with c.http.post(f"{c.router_url}/v1/place") as resp:
        placed = await resp.json()
    src = c.index_of(placed["worker_id"])
    async with c.http.ws_connect(placed["url"]) as ws:
        await send(ws, Start(session_id=placed["session_id"], fps=30.0, codec="raw"))
        started = await recv_type(ws, Started)
        msgs: list[object] = list(await frames(ws, 3))
        await c.drain(src)
        while not isinstance(msgs[-1], Ended):
            msgs.append(await recv(ws))
    migrate = next(m for m in msgs if isinstance(m, Migrate))
    assert isinstance(started, Started) and migrate.worker == f"w{1 - src}"
    await asyncio.wait_for(c.workers[src][AGENT].drained.wait(), 10)
    return 1 - src, started, migrate


async def _until_orphaned(c: Cluster, sid: str) -> None:
    async def orphaned() -> bool:
        rec = await c.directory.get_session(sid)
        return rec is not None and rec.state is SessionState.ORPHANED

    await until(orphaned, what=f"{sid} orphaned")


async def test_a_handover_its_client_never_takes_up_frees_the_target_s_slot() -> None:
    d = MemoryDirectory(handover_ttl_s=HANDOVER_TTL)
    async with cluster(2, capacity=1, directory=lambda: d) as c:
        dst, started, _ = await _abandoned_handover(c)
        sid = started.session_id
        rec = await d.get_session(sid)
        assert rec is not None and (rec.worker_id, rec.state) == (f"w{dst}", SessionState.MIGRATING)
        # The slot is the directory's: the target itself holds nothing until a resume.
        target = c.workers[dst][SERVICE]
        assert target.sessions() == [] and len(target.store) == 0
        assert (await d.get_worker(f"w{dst}")).load == 1  # type: ignore[union-attr]
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            assert resp.status == 503  # the target is full, the other one left
        await _until_orphaned(c, sid)
        assert (await d.get_worker(f"w{dst}")).load == 0  # type: ignore[union-attr]
        assert target.sessions() == [] and len(target.store) == 0
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            assert resp.status == 200 and (await resp.json())["worker_id"] == f"w{dst}"


async def test_a_late_client_resumes_an_expired_handover_through_the_router() -> None:
    d = MemoryDirectory(handover_ttl_s=HANDOVER_TTL)
    async with cluster(2, capacity=1, directory=lambda: d) as c:
        dst, started, migrate = await _abandoned_handover(c)
        sid = started.session_id
        await _until_orphaned(c, sid)
        async with c.http.post(f"{c.router_url}/v1/resume", json={"session_id": sid}) as resp:
            assert resp.status == 200
            where = await resp.json()
        assert (where["worker_id"], where["state"]) == (f"w{dst}", "migrating")
        rec = await d.get_session(sid)  # re-placed as a handover: it waits a while only
        assert rec is not None and rec.state is SessionState.MIGRATING
        async with c.http.ws_connect(where["url"]) as ws:
            await send(ws, Resume(sid, started.token, migrate.block_idx))
            resumed = await recv_type(ws, Resumed)
            assert isinstance(resumed, Resumed)
            assert (resumed.block_idx, resumed.restored_from) == (migrate.block_idx, migrate.block_idx)
            got = [f.block_idx for f in await frames(ws, 3)]
            assert got[0] == migrate.block_idx and got == sorted(got)
            await asyncio.sleep(HANDOVER_TTL + 0.3)  # resumed: the slot stays taken
            rec = await d.get_session(sid)
            assert rec is not None and rec.state is SessionState.ACTIVE
            assert (await d.get_worker(f"w{dst}")).load == 1  # type: ignore[union-attr]


async def test_a_session_record_lost_in_the_directory_is_checkpointed_again() -> None:
    async with cluster(1) as c:
        async with c.http.post(f"{c.router_url}/v1/place") as resp:
            placed = await resp.json()
        sid = placed["session_id"]
        async with c.http.ws_connect(placed["url"]) as ws:
            await send(ws, Start(session_id=sid, fps=30.0, codec="raw"))
            assert isinstance(await recv_type(ws, Started), Started)

            async def checkpointed() -> bool:
                return await c.directory.get_snapshot(sid) is not None

            await until(checkpointed, what="a checkpoint")
            await c.directory.release_session(sid)  # lost: an eviction, a flush
            await c.directory.delete_snapshot(sid)

            async def again() -> bool:
                rec = await c.directory.get_session(sid)
                return rec is not None and rec.worker_id == "w0" and await c.directory.get_snapshot(sid) is not None

            await until(again, what="the record and a checkpoint written again")
