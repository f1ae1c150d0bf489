"""Decoding a batch while the next one generates (``WanRunner._run_batches`` with ``overlap``):
the frames, their order and the errors are those of the serial order, for the Wan runner and
Matrix-Game's. On the CPU the overlapped order runs the next batch's generation before the
previous batch's decode (on CUDA the decode goes to a second stream instead; that part runs
only on a GPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.model.wan.tiny_dir import HEIGHT, load_tiny
from worldserve.model.wan.runner import WanRunner
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepOutput, StepPlan

BUCKET = HEIGHT
SIDS = ("a", "b", "c")


def runner(family: str, weights: Path, overlap: bool) -> WanRunner:
    r = load_tiny(family, weights, max_sessions=4)
    assert isinstance(r, WanRunner) and r.overlap is False  # the CPU's default: serial
    r.overlap = overlap
    return r


def plan(r: WanRunner, block: int, sids: tuple[str, ...] = SIDS) -> StepPlan:
    """One batch a session: three batches in one plan."""
    n = r.first_chunk_frames if block == 0 else r.frames_per_chunk
    act = np.zeros((n, ACTION_DIM), np.float32)
    act[:, block % 4] = 1  # keys held (Matrix-Game reads them)
    return StepPlan(batches=[Batch(BUCKET, r.max_steps, [ChunkWork(s, block, act)]) for s in sids])


def served(r: WanRunner, blocks: int) -> list[StepOutput]:
    outs = [r.execute(StepPlan(new_sessions=[SessionSpec(s, BUCKET, i + 1, "a lake at dawn")
                                             for i, s in enumerate(SIDS)]))]
    outs += [r.execute(plan(r, b)) for b in range(blocks)]
    outs.append(r.execute(plan(r, blocks, ("a", "gone", "c"))))  # a session the runner does not hold
    return outs


def same(serial: list[StepOutput], overlapped: list[StepOutput]) -> None:
    for s, o in zip(serial, overlapped, strict=True):
        assert [(c.session_id, c.block_idx) for c in o.results] == [(c.session_id, c.block_idx) for c in s.results]
        for cs, co in zip(s.results, o.results, strict=True):
            np.testing.assert_array_equal(co.frames, cs.frames)
        assert o.errors == s.errors
        assert [(t.bucket, t.steps, t.size) for t in o.timings] == \
            [(t.bucket, t.steps, t.size) for t in s.timings]
    assert overlapped[-1].errors.keys() == {"gone"}
    assert [c.session_id for c in overlapped[1].results] == list(SIDS)


@pytest.mark.parametrize("family", ["wan-causal", "matrix-game-2"])
def test_overlapped_decoding_gives_the_serial_frames_in_the_plan_s_order(family, wan_dir, mg_dir):
    weights = wan_dir if family == "wan-causal" else mg_dir
    same(served(runner(family, weights, False), 3), served(runner(family, weights, True), 3))


def call_order(weights: Path, overlap: bool) -> list[str]:
    """What a plan of three one-session batches calls, in order: generate (a batch's first
    denoising step) or decode."""
    r = runner("wan-causal", weights, overlap)
    r.execute(StepPlan(new_sessions=[SessionSpec(s, BUCKET, 1, "a lake") for s in SIDS]))
    calls: list[str] = []
    denoise, decode = r.model.denoise, r.decoder.decode_batch

    def spy_denoise(x, *a, **k):
        if float(a[0][0]) == r.cfg.step_timesteps[0]:
            calls.append("generate")
        return denoise(x, *a, **k)

    def spy_decode(streams, x0):
        calls.append("decode")
        return decode(streams, x0)

    r.model.denoise, r.decoder.decode_batch = spy_denoise, spy_decode  # type: ignore[method-assign]
    act = np.zeros((9, ACTION_DIM), np.float32)
    out = r.execute(StepPlan(batches=[Batch(BUCKET, r.max_steps, [ChunkWork(s, 0, act)]) for s in SIDS]))
    assert [c.session_id for c in out.results] == list(SIDS)
    return calls


def test_overlapped_the_next_batch_generates_before_the_previous_one_decodes(wan_dir):
    assert call_order(wan_dir, False) == ["generate", "decode"] * 3
    assert call_order(wan_dir, True) == ["generate", "generate", "decode", "generate", "decode", "decode"]
