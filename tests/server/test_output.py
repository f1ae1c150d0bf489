"""A chunk's one way out (server/engine_events.py): the ring, then the peer, push chunks at
their display time and pull chunks at once."""

from __future__ import annotations

import asyncio
import time
from collections import deque

import numpy as np

from tests.polling import until
from worldserve.protocol import Ended, Resumed, ServerMessage, Start, Started
from worldserve.server.engine_events import EngineEvents
from worldserve.server.gate import Gate
from worldserve.server.limits import TokenBucket
from worldserve.server.live import Chunk, Live, Shape
from worldserve.server.metrics import Metrics
from worldserve.server.sessions import Sessions
from worldserve.server.settings import Settings
from worldserve.session.degrade import Rung
from worldserve.session.scheduler import ChunkReady
from worldserve.session.session import Session, SessionConfig, hash_token


class Peer:
    def __init__(self) -> None:
        self.got: list[tuple[int, bool, float]] = []  # (block_idx, ordered, monotonic time)

    def attached(self, reply: Started | Resumed, quality: int) -> None: ...

    def send(self, msg: ServerMessage) -> None: ...

    def chunk(self, chunk: Chunk, *, ordered: bool) -> None:
        self.got.append((chunk.block_idx, ordered, time.monotonic()))

    def end(self, ended: Ended, code: int) -> None: ...


def setup(mode: str) -> tuple[EngineEvents, Live, Peer]:
    settings, metrics = Settings(), Metrics()
    sessions = Sessions(settings, metrics, time.monotonic, Gate())
    events = EngineEvents(metrics, time.monotonic, sessions, Shape(), Gate())
    req = Start(mode=mode, fps=50.0, bucket=64)
    session = Session(SessionConfig(fps=50.0), hash_token("t"), session_id="s")
    live = Live(session, req, TokenBucket(10.0, 10, time.monotonic), deque(maxlen=4),
                Rung(50.0, 0, 1, 64), time.monotonic(), TokenBucket(50.0, 2, time.monotonic))
    peer = Peer()
    live.peer = peer
    sessions.add(live)
    return events, live, peer


def ready(block: int, display_time: float | None) -> ChunkReady:
    return ChunkReady("s", block, np.zeros((1, 8, 8, 3), np.uint8), 0, display_time)


async def test_a_push_chunk_made_ahead_reaches_the_peer_at_its_display_time() -> None:
    events, live, peer = setup("push")
    shown_at = time.monotonic() + 0.05
    events.on_event(ready(0, shown_at))
    assert peer.got == [] and [c.block_idx for c in live.ring] == [0]  # in the ring at once
    await until(lambda: bool(peer.got), what="the chunk handed over")
    assert [(b, o) for b, o, _ in peer.got] == [(0, False)]
    assert peer.got[0][2] >= shown_at  # never handed over before its display time
    events.on_event(ready(1, time.monotonic() - 0.01))  # due already: at once
    assert [b for b, _, _ in peer.got] == [0, 1]


async def test_a_held_chunk_is_forgotten_when_the_peer_goes_and_stays_in_the_ring() -> None:
    events, live, peer = setup("push")
    events.on_event(ready(0, time.monotonic() + 0.03))
    live.unbind()
    await asyncio.sleep(0.06)
    assert peer.got == [] and live.find(0) is not None


async def test_pull_chunks_go_to_the_peer_at_once_in_order() -> None:
    events, live, peer = setup("pull")
    for b in range(3):
        events.on_event(ready(b, None))
    assert [(b, o) for b, o, _ in peer.got] == [(0, True), (1, True), (2, True)]
    assert live.next_block == 3
