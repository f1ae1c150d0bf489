"""The canvas's decoder thread (model/default/reference/canvas/tile_decode.py): it works only between chunks,
work the model thread needs is taken back and done where it is needed, and a bf16 decode is
the float32 one within a grey level."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from worldserve.model.default.reference.canvas.canvas import TILE
from worldserve.model.default.reference.canvas.tile_decode import MARGIN, SHARPEN, TileDecoder
from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS, load_tokenizer
from worldserve.world.scene import parse_prompt


def _decoder(**kw: object) -> TileDecoder:
    return TileDecoder(load_tokenizer(WEIGHTS), torch.device("cpu"), **kw)  # type: ignore[arg-type]


def test_the_thread_starts_nothing_inside_a_chunk_and_the_model_thread_takes_queued_work_back() -> None:
    dec = _decoder()
    try:
        where: list[str] = []

        def work() -> str:
            where.append(threading.current_thread().name)
            return "done"

        with dec.busy():
            job = dec.run(work)
            time.sleep(0.2)
            assert not job.future.running() and not job.future.done() and where == []
            assert job.take() == "done"  # still queued: done here, on this thread
        assert where == [threading.current_thread().name]
        assert job.future.cancelled()

        later = dec.run(work)  # between chunks: the decoder's own thread does it
        assert later.future.result(timeout=5) == "done"
        assert where[-1] == "canvas-decode"
        assert later.take() == "done" and len(where) == 2  # taking finished work does not redo it
        # the serving bench's breakdown: one done inside the chunk, one ahead, none waited for
        c = dec.counts
        assert (c.inline, c.ahead, c.waited) == (1, 1, 0) and c.inline_s >= 0.0

        gate = threading.Event()
        running = dec.run(lambda: gate.wait(5))
        while not running.future.running():
            time.sleep(0.01)
        threading.Timer(0.1, gate.set).start()
        assert running.take() is True  # under way on the thread: waited for, not redone
        assert (c.ahead, c.waited) == (2, 1) and c.waited_s >= 0.05
        with dec.busy():  # a fill taken back counts as a fill, not a decode
            assert dec.run(work, fill=True).take() == "done"
        assert (c.inline, c.inline_fills) == (1, 1)
    finally:
        dec.close()


def test_queued_work_runs_most_urgent_first_once_the_chunk_is_over() -> None:
    dec = _decoder()
    try:
        order: list[int] = []
        with dec.busy():
            jobs = [dec.run(lambda u=u: order.append(u), urgency=u) for u in (2, 1, 0, 1)]
        for job in jobs:
            job.future.result(timeout=5)
        assert order == [0, 1, 1, 2]
    finally:
        dec.close()


def test_a_bf16_decode_is_the_float32_decode_within_a_grey_level() -> None:
    """The decoder in bf16 draws what it draws in float32 within a grey level or two; the served
    unsharp mask (float32, on the decode) raises a difference by at most 1 + 2 * its amount."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1024, (TILE + 2 * MARGIN, TILE + 2 * MARGIN)).astype(np.int64)
    scene = parse_prompt("a snowy forest at dusk").to_vector().astype(np.float32)
    for amount, most in ((0.0, 2.0), (SHARPEN, 2.0 * (1 + 2 * SHARPEN))):
        fp32 = _decoder(background=False, sharpen=amount).decode(codes, scene)
        bf16 = _decoder(background=False, dtype=torch.bfloat16, sharpen=amount).decode(codes, scene)
        assert bf16.dtype == torch.float32 and bf16.shape == fp32.shape
        err = (bf16 - fp32).abs() * 127.5
        assert float(err.max()) < most and float(err.mean()) < 0.5, (amount, float(err.max()), float(err.mean()))
        assert not torch.equal(bf16, fp32)  # it did compute in bf16


def test_beside_chunks_the_thread_works_while_the_model_thread_is_inside_one() -> None:
    dec = _decoder(beside_chunks=True)
    try:
        with dec.busy():
            job = dec.run(lambda: threading.current_thread().name)
            assert job.future.result(timeout=5) == "canvas-decode"  # not held back by the chunk
        assert dec.counts.ahead == 1 and dec.counts.inline == 0
    finally:
        dec.close()


def test_the_decode_mode_names_where_the_thread_works() -> None:
    import pytest

    from worldserve.model.cores import SIDE_BY_SIDE, matmul_share
    from worldserve.model.default.reference.canvas.tile_decode import beside_chunks

    cpu = torch.device("cpu")
    assert beside_chunks("beside", cpu, torch.float32) is True
    assert beside_chunks("between", cpu, torch.float32) is False
    assert beside_chunks("auto", torch.device("cuda"), torch.bfloat16) is False  # a GPU: no probe, between
    with pytest.raises(ValueError, match="one of auto, between, beside"):
        beside_chunks("sideways", cpu, torch.float32)
    # auto on a CPU follows the probe; the probe leaves the caller's thread count as it was
    threads = torch.get_num_threads()
    ratio = matmul_share(torch.float32, 0.1, n=64)
    assert torch.get_num_threads() == threads and 0.2 < ratio < 10 and SIDE_BY_SIDE > 1
