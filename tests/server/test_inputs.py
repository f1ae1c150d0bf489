"""Client inputs while a hand-off has taken the session out of the engine: its client is
still attached until ``migrate``, and what it sends then must not break the connection."""

from __future__ import annotations

import aiohttp

from tests.server.harness import frames, recv, recv_type, send, serve
from worldserve.protocol import Ack, Block, Frame, Prompt, Start, Started, decode_server
from worldserve.server.keys import AGENT


async def quiet(ws: aiohttp.ClientWebSocketResponse, seconds: float = 0.3) -> list[object]:
    """Whatever arrives within ``seconds`` (frames, errors, a close)."""
    got: list[object] = []
    while True:
        try:
            msg = await ws.receive(timeout=seconds)
        except TimeoutError:
            return got
        if msg.type is not aiohttp.WSMsgType.BINARY:
            return [*got, msg.type]
        got.append(decode_server(msg.data))


async def test_pull_requests_and_prompts_during_a_hand_off_are_accepted_quietly() -> None:
    async with serve() as s:
        ws = await s.connect()
        await send(ws, Start(mode="pull", codec="raw"))
        started = await recv(ws)
        assert isinstance(started, Started)
        sid = started.session_id
        await send(ws, Block(1))
        assert [f.block_idx for f in await frames(ws, 2)] == [0, 1]
        handoff = await s.app[AGENT].migration.hand_off(sid)  # out of the engine; the client still attached
        assert handoff is not None and handoff.next_block == 2
        assert sid not in s.service.engine.scheduler  # type: ignore[union-attr]
        await send(ws, Block(2))
        await send(ws, Prompt("a snowy forest at night", 7))
        ack = await recv_type(ws, Ack)
        assert ack == Ack("prompt", 7)
        rest = await quiet(ws)
        assert not any(isinstance(m, Frame) for m in rest) and not ws.closed, rest
        # The request was accepted: the store numbers it, and a resume asks for it again.
        assert s.service.store.get(sid).last_block_idx == 2
        assert s.service.live(sid).scene == "a snowy forest at night"  # type: ignore[union-attr]
        await ws.close()
