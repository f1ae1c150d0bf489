"""Saved worlds through the server (fake runner): save by message and by HTTP, list, fork, delete,
and the refusals that change nothing; crash checkpoints of the embedded server resumed by a new
process with the gap they cost."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from tests.polling import until
from tests.server.harness import frames, recv, recv_type, send, serve
from worldserve.protocol import Close, Error, Resume, Resumed, Save, Saved, Start, Started

ADMIN = "admin-key-123"


async def _started(s, **kw: object) -> tuple[object, Started]:  # type: ignore[no-untyped-def]
    ws = await s.connect()
    await send(ws, Start("a green forest", seed=5, fps=24.0, **kw))  # type: ignore[arg-type]
    st = await recv(ws)
    assert isinstance(st, Started), st
    return ws, st


async def test_a_saved_world_is_listed_forked_at_its_block_and_deleted_by_its_owner_only(tmp_path: Path) -> None:
    async with serve(store=str(tmp_path / "store"), admin_key=ADMIN) as s:
        ws, st = await _started(s)
        await frames(ws, 6)
        await send(ws, Save("my forest"))
        saved = await recv_type(ws, Saved)
        assert isinstance(saved, Saved) and saved.name == "my forest" and saved.block_idx > 0
        listed = await (await s.http.get(s.url("/v1/worlds"))).json()
        assert [w["id"] for w in listed["worlds"]] == [saved.world]
        assert "owner_sha256" not in listed["worlds"][0] and listed["worlds"][0]["frames"] == saved.frames

        fork_ws = await s.connect()
        await send(fork_ws, Start(world=saved.world, codec="raw"))
        forked = await recv(fork_ws)
        assert isinstance(forked, Started), forked
        assert forked.session_id != st.session_id and forked.token != st.token
        assert forked.world == saved.world and forked.block_idx == saved.block_idx
        got = await frames(fork_ws, 4)
        assert got[0].block_idx == saved.block_idx and got[0].codec == "raw"

        url = s.url(f"/v1/worlds/{saved.world}")
        assert (await s.http.delete(url)).status == 401
        assert (await s.http.delete(url, headers={"X-Session-Token": forked.token})).status == 404
        assert (await s.http.delete(url, headers={"X-Session-Token": st.token})).status == 200
        assert (await (await s.http.get(s.url("/v1/worlds"))).json())["worlds"] == []
        for w in (ws, fork_ws):
            await w.close()


async def test_save_over_http_needs_the_token_and_the_admin_key_deletes_any_world(tmp_path: Path) -> None:
    async with serve(store=str(tmp_path / "store"), admin_key=ADMIN) as s:
        ws, st = await _started(s)
        await frames(ws, 4)
        url = s.url(f"/v1/sessions/{st.session_id}/save")
        assert (await s.http.post(url, json={"name": "x"})).status == 401
        assert (await s.http.post(url, json={"name": "x"}, headers={"X-Session-Token": "wrong"})).status == 404
        bad = await s.http.post(url, json={"name": ""}, headers={"X-Session-Token": st.token})
        assert bad.status == 422 and (await bad.json())["error"] == "bad_world"
        ok = await s.http.post(url, json={"name": "by http"}, headers={"X-Session-Token": st.token})
        assert ok.status == 200
        world = (await ok.json())["world"]
        gone = await s.http.delete(s.url(f"/v1/worlds/{world}"), headers={"Authorization": f"Bearer {ADMIN}"})
        assert gone.status == 200
        await ws.close()


async def test_an_unknown_or_corrupt_world_is_refused_by_name_and_the_connection_goes_on(tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with serve(store=str(store)) as s:
        ws, _ = await _started(s)
        await frames(ws, 4)
        await send(ws, Save("kept"))
        saved = await recv_type(ws, Saved)
        assert isinstance(saved, Saved)
        other = await s.connect()
        await send(other, Start(world="no-such-world-id"))
        err = await recv_type(other, Error)
        assert isinstance(err, Error) and err.code == "unknown_world" and not err.fatal
        state = store / "worlds" / saved.world / "state"
        state.write_bytes(state.read_bytes()[:-10])  # truncated
        await send(other, Start(world=saved.world))
        err = await recv_type(other, Error)
        assert isinstance(err, Error) and err.code == "corrupt_object" and not err.fatal
        await send(other, Start("after the refusals"))  # nothing was opened: a start still works
        assert isinstance(await recv(other), Started)
        for w in (ws, other):
            await w.close()


async def test_without_a_store_save_and_worlds_answer_store_error() -> None:
    async with serve() as s:
        ws, _ = await _started(s)
        await send(ws, Save("nowhere"))
        err = await recv_type(ws, Error)
        assert isinstance(err, Error) and err.code == "store_error" and not err.fatal
        listed = await s.http.get(s.url("/v1/worlds"))
        assert listed.status == 404 and (await listed.json())["error"] == "store_error"
        await ws.close()


async def test_after_a_crash_a_new_server_resumes_the_session_from_its_checkpoint_with_its_gap(
    tmp_path: Path,
) -> None:
    store, crashed = tmp_path / "store", tmp_path / "after-crash"
    async with serve(store=str(store), snapshot_interval_s=0.2) as s:
        ws, st = await _started(s)
        await frames(ws, 10)
        await until(lambda: (store / "sessions" / f"s{st.session_id}" / "handoff").exists(), what="a checkpoint")
        shutil.copytree(store, crashed)  # the store as a killed process leaves it
        got = await frames(ws, 12)  # shown after that checkpoint: lost to the crash
        await ws.close()
    async with serve(store=str(crashed), snapshot_interval_s=0.2) as s2:
        ws2 = await s2.connect()
        await send(ws2, Resume(st.session_id, "not the token", got[-1].block_idx + 1))
        err = await recv_type(ws2, Error)
        assert isinstance(err, Error) and err.code == "bad_token"
        ws3 = await s2.connect()
        await send(ws3, Resume(st.session_id, st.token, got[-1].block_idx + 1))
        resumed = await recv_type(ws3, Resumed)
        assert isinstance(resumed, Resumed) and resumed.restored_from >= 0
        assert resumed.block_idx == got[-1].block_idx + 1
        assert resumed.gap_blocks == resumed.block_idx - resumed.restored_from > 0
        more = await frames(ws3, 4)
        assert more[0].block_idx == resumed.block_idx
        await ws3.close()


async def test_a_session_closed_for_good_leaves_no_checkpoint_and_a_start_with_a_reservation_is_refused(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    async with serve(store=str(store), snapshot_interval_s=0.2) as s:
        ws, st = await _started(s)
        kept = store / "sessions" / f"s{st.session_id}"
        await until(lambda: (kept / "handoff").exists() and (kept / "token").exists(), what="a checkpoint")
        await send(ws, Close())
        await until(lambda: not (kept / "handoff").exists() and not (kept / "token").exists(),
                    what="the checkpoint deleted")
        other = await s.connect()
        await send(other, Start("placed", session_id="a-reservation"))
        err = await recv_type(other, Error)
        assert isinstance(err, Error) and err.code == "placement_required"
        await other.close()


async def test_a_token_left_without_its_checkpoint_is_swept_when_the_server_starts(tmp_path: Path) -> None:
    from worldserve.server.cluster.keeper import TOKEN_KIND
    from worldserve.server.store import LocalStore

    store = tmp_path / "store"
    await asyncio.to_thread(lambda: LocalStore(store).put("sessions/sgone-session/token", bytes(32), TOKEN_KIND))
    async with serve(store=str(store), snapshot_interval_s=0.2):
        await until(lambda: not (store / "sessions" / "sgone-session" / "token").exists(), what="the sweep")
