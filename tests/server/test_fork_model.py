"""A fork of a saved world makes, bit for bit, the frames the original made from the saved point
given the same actions: the real default model on the CPU in float32, through the real server."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.server.harness import recv, recv_type, send
from tests.server.test_e2e_model import model_server, smallest_bucket
from worldserve.protocol import Action, Block, Frame, Save, Saved, Start, Started


async def _block(ws: aiohttp.ClientWebSocketResponse, n: int, count: int) -> list[bytes]:
    """The ``count`` frames of block ``n`` (status and other messages skipped)."""
    got: list[bytes] = []
    while len(got) < count:
        msg = await recv(ws, 60)
        if isinstance(msg, Frame):
            assert msg.block_idx == n and msg.codec == "raw"
            got.append(msg.data)
        assert msg.TYPE not in ("error", "ended"), msg
    return got


async def test_a_fork_makes_the_original_s_frames_bit_for_bit_from_the_saved_block(
    model_weights: Path, tmp_path: Path,
) -> None:
    bucket = smallest_bucket(model_weights)
    async with model_server(model_weights, dtype="float32", store=str(tmp_path / "store")) as s:
        ws = await s.connect()
        await send(ws, Start("a green forest", seed=7, fps=4.0, bucket=bucket, codec="raw", mode="pull"))
        st = await recv(ws)
        assert isinstance(st, Started)
        count = st.chunk_frames
        await _block(ws, 0, st.first_chunk_frames or count)
        for n in range(1, 4):
            if n == 2:
                await send(ws, Action(1, ("right",)))  # held across the save: the fork holds it too
            await send(ws, Block(n))
            await _block(ws, n, count)
        await send(ws, Save("forest at block 4"))
        saved = await recv_type(ws, Saved)
        assert isinstance(saved, Saved) and saved.block_idx == 4
        original: list[bytes] = []
        for n in range(4, 8):
            if n == 6:
                await send(ws, Action(2, ("forward", "left")))
            await send(ws, Block(n))
            original += await _block(ws, n, count)
        await ws.close()

        fork = await s.connect()
        await send(fork, Start(world=saved.world, codec="raw", mode="pull"))
        fst = await recv(fork)
        assert isinstance(fst, Started) and fst.block_idx == 4 and fst.session_id != st.session_id
        forked = await _block(fork, 4, count)  # the fork's first block comes without asking
        for n in range(5, 8):
            if n == 6:
                await send(fork, Action(1, ("forward", "left")))
            await send(fork, Block(n))
            forked += await _block(fork, n, count)
        await fork.close()
    assert len(forked) == len(original) == 4 * count
    assert forked == original
