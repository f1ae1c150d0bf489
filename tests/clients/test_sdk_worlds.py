"""The SDK's saved-world calls (clients/worlds.py) against a server with the fake runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.harness import serve
from worldserve.clients.sdk import SessionEnded, WorldClient
from worldserve.clients.worlds import WorldRefused, delete_world, fork, list_worlds, save

ADMIN = "admin-key-123"


async def test_the_sdk_saves_lists_forks_and_deletes_a_world(tmp_path: Path) -> None:
    async with serve(store=str(tmp_path / "store"), admin_key=ADMIN) as s:
        async with WorldClient(s.ws_url, http=s.http) as client:
            started = await client.start("a green forest", seed=4, mode="pull")
            for _ in range(3):
                await client.block()
            saved = await save(client, "three blocks in", http=s.http)
            assert saved.block_idx == 4 and saved.frames > 0
            worlds = await list_worlds(s.ws_url, http=s.http)
            assert [w["id"] for w in worlds] == [saved.world] and worlds[0]["name"] == "three blocks in"
            async with WorldClient(s.ws_url, http=s.http) as other:
                got = await fork(other, saved.world, mode="pull")
                assert got.block_idx == 4 and got.session_id != started.session_id and got.world == saved.world
                ev = await other.next_frame(timeout=10)
                assert ev.block_idx == 4
                assert (await other.block()).block_idx == 5  # the next block after the world's
            with pytest.raises(WorldRefused) as refused:
                await delete_world(s.ws_url, saved.world, token="not-the-token", http=s.http)
            assert refused.value.code == "unknown_world"
            await delete_world(s.ws_url, saved.world, token=started.token, http=s.http)
            assert await list_worlds(s.ws_url, http=s.http) == []


async def test_forking_an_unknown_world_raises_with_the_server_s_code(tmp_path: Path) -> None:
    async with serve(store=str(tmp_path / "store")) as s, WorldClient(s.ws_url, http=s.http) as client:
        with pytest.raises(SessionEnded, match="unknown_world"):
            await fork(client, "no-such-world-0")
