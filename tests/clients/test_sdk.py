"""The Python SDK against a server with the fake runner."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.polling import until
from tests.server.harness import serve
from worldserve.clients.examples.steer import steer
from worldserve.clients.sdk import SessionEnded, WorldClient
from worldserve.protocol import Ended, Error
from worldserve.session.fake_runner import decode_frame


async def test_push_frames_decode_and_report_applied_actions() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        started = await client.start("forest", fps=50.0, codec="raw", lookahead=0)
        first = await client.next_frame(5)
        assert first.image is not None and first.image.shape == (64, 64, 3)
        assert decode_frame(first.image)[0] == first.block_idx
        seq = await client.action(["forward"], (0.1, 0.0))
        await client.prompt("a snowy forest at night")  # returns on the ack
        for _ in range(30):
            ev = await client.next_frame(5)
            if ev.msg.action_seq == seq:
                break
        assert ev.msg.action_seq == seq and ev.msg.session_id == started.session_id
        assert await client.ping() < 1.0


@pytest.mark.parametrize("codec", ["jpeg", "h264"])
async def test_compressed_codecs_decode_to_images(codec: str) -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start(fps=40.0, codec=codec)  # type: ignore[arg-type]
        for _ in range(5):
            ev = await client.next_frame(5)
            assert ev.image is not None and ev.image.shape == (64, 64, 3)


async def test_pull_blocks_come_back_in_order() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start(mode="pull", codec="raw")
        assert (await client.next_frame(5)).block_idx == 0
        got = [(await client.block()).block_idx for _ in range(5)]
        assert got == [1, 2, 3, 4, 5]


async def test_a_dropped_push_connection_resumes_with_no_gap_or_repeat() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start(fps=40.0, codec="raw")
        got = [(await client.next_frame(5)).block_idx for _ in range(8)]
        client.simulate_drop()
        got += [(await client.next_frame(10)).block_idx for _ in range(12)]
        assert got == list(range(20))
        assert client.reconnects == 1 and client.resumed is not None
        assert client.resumed.block_idx == 8


async def test_a_dropped_pull_connection_resumes_and_asks_again_for_lost_requests() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        await client.start(mode="pull", codec="raw")
        await client.next_frame(5)
        for _ in range(3):
            await client.block()
        await client.request()  # 4
        await client.request()  # 5
        client.simulate_drop()
        got = [(await client.next_frame(10)).block_idx for _ in range(2)]
        assert got == [4, 5]
        assert (await client.block()).block_idx == 6


async def test_a_session_ended_by_the_server_is_not_resumed() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        started = await client.start(fps=20.0)
        await client.next_frame(5)
        assert s.service.close(started.session_id, "deleted")
        with pytest.raises(SessionEnded):
            while True:
                await client.recv(5)
        assert isinstance(client.ended, Ended) and client.ended.reason == "deleted"
        assert client.reconnects == 0


async def test_a_refused_start_raises_with_the_servers_error() -> None:
    async with serve(api_keys=frozenset({"k"})) as s:
        async with WorldClient(s.ws_url, http=s.http) as client:
            with pytest.raises(SessionEnded, match="unauthorized"):
                await client.start()
        async with WorldClient(s.ws_url, http=s.http, api_key="k") as client:
            await client.start(fps=20.0)
            assert client.ended is None or not isinstance(client.ended, Error)


async def test_steer_example_saves_png_frames(tmp_path: object) -> None:
    from pathlib import Path

    out = Path(str(tmp_path)) / "frames"
    async with serve() as s:
        saved = await steer(s.ws_url, out, frames=30, fps=50.0)
    assert len(saved) == 30 and all(p.exists() for p in saved)
    img = np.asarray(Image.open(saved[0]))
    assert img.shape == (64, 64, 3)


async def test_each_resume_gives_the_client_a_new_token_and_spends_the_old_one() -> None:
    async with serve() as s, WorldClient(s.ws_url, http=s.http) as client:
        started = await client.start(fps=40.0, codec="raw")
        await client.next_frame(5)
        for drop in range(2):
            before = client.started.token if client.started else ""
            client.simulate_drop()
            await until(lambda n=drop + 1: client.reconnects == n, what="the client resumed")
            await client.next_frame(10)
            assert client.started is not None and client.started.token != before
        session = s.service.store.peek(started.session_id)
        assert session is not None and session.check_token(client.started.token)
        assert not session.check_token(started.token)
