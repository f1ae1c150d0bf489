"""A WebRTC session follows its worker's drain: two in-process workers (fake runner)
sharing a directory, the aiortc client of bench/_rtc_client.py.

The draining worker sends ``migrate`` and ``ended: migrated`` on the ``control`` channel
and hangs up; the client re-offers to the target with ``resume`` (session_id, token and
the migrate's block_idx), as clients/web/session.js does, and the session goes on there.

The fake runner paints every pixel of frame k with (k % 256, k // 256, session tag), so
the decoded video says roughly which frame of which session arrived: the RGB -> yuv420p
-> RGB round trip alone moves such a colour by up to 3 levels and merges neighbouring
frames, and H.264 adds ~2, so a picture names its frame within ``INDEX_TOLERANCE``.
Exact indices come from the status messages (``frame``: the frame the server's track
last handed to the encoder).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from av import VideoFrame

from tests.polling import until
from tests.scaleout.harness import Cluster, cluster
from worldserve.bench._rtc_client import OfferRefused, RtcClient, http_base
from worldserve.protocol import Ack, Ended, Migrate, Ping, Pong, Resumed, Started, Status
from worldserve.server.cluster.directory import SessionState
from worldserve.server.keys import AGENT, SERVICE
from worldserve.server.rtc.keys import RTC_PEERS
from worldserve.server.rtc.peer import RtcPeer
from worldserve.session.fake_runner import session_tag

START = {"prompt": "a green forest", "fps": 30.0, "bucket": 64, "lookahead": 1}
COLOUR_TOLERANCE = 4  # levels H.264 moves a flat picture by (2 measured)
INDEX_TOLERANCE = 6  # frames whose colours are that close after the round trip


def colours(sid: str, n: int = 256) -> np.ndarray:
    """(n, 3): fake frame k of session ``sid`` after the video path's colour conversion
    (RGB -> yuv420p -> RGB, no codec)."""
    img = np.empty((n, 16, 16, 3), np.uint8)
    img[...] = np.stack([np.arange(n) % 256, np.arange(n) // 256,
                         np.full(n, session_tag(sid))], axis=1)[:, None, None, :]
    return np.array([
        VideoFrame.from_ndarray(img[k], format="rgb24").reformat(format="yuv420p")
        .to_ndarray(format="rgb24")[0, 0] for k in range(n)
    ], np.float64)


def frame_index(frame: Any, table: np.ndarray) -> int:
    """Which fake frame a decoded video frame shows, within ``INDEX_TOLERANCE``; fails if
    it is none of the table's (another session's picture, or garbage)."""
    rgb = frame.to_ndarray(format="rgb24").reshape(-1, 3)
    dist = np.abs(table - np.median(rgb, axis=0)).max(axis=1)
    k = int(np.argmin(dist))
    assert dist[k] <= COLOUR_TOLERANCE, (np.median(rgb, axis=0), table[k])
    return k


async def video_until(client: RtcClient, table: np.ndarray, index: int,
                      timeout: float = 10.0) -> list[int]:
    """Decoded frames of the current connection until one shows frame ``index`` or later;
    returns the indices seen."""
    end = time.monotonic() + timeout
    seen: list[int] = []
    while not seen or seen[-1] < index:
        _, frame = await client.next_frame(max(0.001, end - time.monotonic()))
        seen.append(frame_index(frame, table))
    return seen


async def status_where(client: RtcClient, cond: Callable[[dict[str, Any]], bool],
                       timeout: float = 10.0) -> dict[str, Any]:
    """The next status (on control) whose wire map satisfies ``cond``."""
    end = time.monotonic() + timeout
    while True:
        msg, wire = await client.message(Status, max(0.001, end - time.monotonic()))
        assert isinstance(msg, Status)
        if cond(wire):
            return wire


async def place(c: Cluster) -> tuple[str, str, int]:
    """(session_id, worker address, worker index) of a reservation from the router."""
    async with c.http.post(f"{c.router_url}/v1/place") as resp:
        assert resp.status == 200
        placed = await resp.json()
    return placed["session_id"], placed["address"], c.index_of(placed["worker_id"])


async def test_a_webrtc_session_migrates_when_its_worker_drains() -> None:
    async with cluster(2) as c:
        sid, address, src = await place(c)
        dst = 1 - src
        a, b = c.workers[src], c.workers[dst]

        async with RtcClient(address) as client:
            # --- on worker A: video, control messages and an action ---
            answer = await client.connect(start={**START, "session_id": sid})
            assert answer["session"]["type"] == "started" and client.session_id == sid
            started, _ = await client.message(Started)
            assert isinstance(started, Started) and started.session_id == sid
            fpc, table = started.chunk_frames, colours(sid)
            # this session's video plays (for a second: frame numbers well clear of 0)
            seen_a = await video_until(client, table, 30, timeout=20)
            ack = await client.prompt("a snowy forest at night")
            assert isinstance(ack, Ack) and ack.of == "prompt"
            seq_a = client.action(["forward"])
            wire = await status_where(client, lambda w: w.get("action_seq") == seq_a)
            last_sent_a = int(wire["frame"])
            assert a[SERVICE].live(sid).action_seq == seq_a  # type: ignore[union-attr]
            (peer_a,) = a[RTC_PEERS]
            assert isinstance(peer_a, RtcPeer) and peer_a.sid == sid

            # --- drain A: migrate, ended and the hang-up arrive on control ---
            await c.drain(src)
            migrate, _ = await client.message(Migrate, 10)
            assert isinstance(migrate, Migrate)
            assert migrate.session_id == sid and migrate.worker == f"w{dst}"
            assert migrate.url == c.worker_url(dst).replace("http", "ws", 1) + "/v1/ws"
            assert http_base(migrate.url) == c.worker_url(dst)
            assert migrate.retry_after is None
            assert migrate.block_idx * fpc > last_sent_a  # the next block A did not generate
            assert max(seen_a) < migrate.block_idx * fpc + INDEX_TOLERANCE
            ended, _ = await client.message(Ended, 5)
            assert isinstance(ended, Ended) and (ended.session_id, ended.reason) == (sid, "migrated")
            await asyncio.wait_for(client.control_closed.wait(), 10)  # what the browser follows

            # --- nothing is left on A ---
            await asyncio.wait_for(a[AGENT].drained.wait(), 10)
            assert a[SERVICE].live(sid) is None and sid not in a[SERVICE].sessions()
            assert len(a[SERVICE].store) == 0
            await asyncio.wait_for(peer_a.wait_closed(), 5)
            assert not a[RTC_PEERS] and peer_a.closed and peer_a.sid is None
            assert peer_a.pc.connectionState == "closed"
            rec = await c.directory.get_session(sid)
            assert rec is not None and rec.worker_id == f"w{dst}"
            assert rec.state is SessionState.MIGRATING and rec.block_idx == migrate.block_idx
            assert [w.worker_id for w in await c.directory.list_workers()] == [f"w{dst}"]

            # --- re-offer to B with resume: the session goes on at the migrate's block ---
            answer = await client.follow(migrate)
            assert client.base_url == c.worker_url(dst)
            session = answer["session"]
            assert (session["type"], session["session_id"]) == ("resumed", sid)
            resumed, _ = await client.message(Resumed)
            assert isinstance(resumed, Resumed)
            assert resumed.block_idx == migrate.block_idx
            assert resumed.restored_from == migrate.block_idx and resumed.gap_blocks == 0
            assert resumed.replayed == 0 and resumed.epoch == started.epoch
            live_b = b[SERVICE].live(sid)
            assert live_b is not None and live_b.peer is not None
            assert live_b.scene == "a snowy forest at night"  # the prompt moved too

            # video flows again, from the migrate's block on
            k = migrate.block_idx * fpc
            first_b = await status_where(client, lambda w: "frame" in w)
            assert int(first_b["frame"]) >= k
            seen_b = await video_until(client, table, k + 10)  # and moves on
            assert min(seen_b) >= k - INDEX_TOLERANCE, (k, seen_b)  # nothing from before K

            # actions on B's 'actions' channel reach the session and its frames
            seq_b = client.action(["left"], (0.5, 0.0))
            assert seq_b > seq_a
            wire = await status_where(client, lambda w: w.get("action_seq") == seq_b)
            assert int(wire["frame"]) > int(first_b["frame"])
            assert live_b.action_seq == seq_b
            client.send(Ping(9))  # and control works both ways
            pong, _ = await client.message(Pong)
            assert isinstance(pong, Pong) and pong.id == 9

            async def active_on_b() -> bool:
                rec = await c.directory.get_session(sid)
                return rec is not None and rec.worker_id == f"w{dst}" and rec.state is SessionState.ACTIVE

            await until(active_on_b)

            await client.close()  # ends the session for good, on B

        async def gone_from_b() -> bool:
            return not b[RTC_PEERS] and len(b[SERVICE].store) == 0

        await until(gone_from_b)
        assert a[SERVICE].live(sid) is None and not a[RTC_PEERS]


async def test_a_resume_offer_goes_to_the_worker_holding_the_session() -> None:
    """Elsewhere than its worker a resume offer is 409 ``session_moved``; at a draining
    worker 503 ``not_ready``; at the migration's target without ``block_idx`` (a client
    that cannot count blocks) it goes on at the handoff's block, with no gap."""
    async with cluster(2) as c:
        sid, address, src = await place(c)
        dst = 1 - src
        async with RtcClient(address) as client:
            await client.connect(start={**START, "session_id": sid})
            await client.next_frame()
            resume = {"session_id": sid, "token": client.token}
            async with RtcClient(c.worker_url(dst)) as stray:
                with pytest.raises(OfferRefused) as refused:
                    await stray.connect(resume=resume)
            assert (refused.value.status, refused.value.body["error"]) == (409, "session_moved")
            assert c.workers[dst][SERVICE].live(sid) is None

            await c.drain(src)
            migrate, _ = await client.message(Migrate, 10)
            assert isinstance(migrate, Migrate) and migrate.worker == f"w{dst}"
            await asyncio.wait_for(client.control_closed.wait(), 10)
            with pytest.raises(OfferRefused) as refused:
                await client.connect(resume=resume)  # back at the draining worker
            assert (refused.value.status, refused.value.body["error"]) == (503, "not_ready")

            client.base_url = http_base(migrate.url)
            answer = await client.connect(resume=resume)  # no block_idx
            session = answer["session"]
            assert (session["type"], session["block_idx"]) == ("resumed", migrate.block_idx)
            assert (session["restored_from"], session["gap_blocks"]) == (migrate.block_idx, 0)
            first = await status_where(client, lambda w: "frame" in w)
            assert int(first["frame"]) >= migrate.block_idx * int(session["chunk_frames"])
            await client.close()
