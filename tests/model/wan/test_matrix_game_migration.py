"""A Matrix-Game session restored on a fresh runner through snapshot bytes goes on with the
frames of the undisturbed session: the snapshot's action trace (the pixel-frame actions the
kept latents were made with, the anchor's frame) lets the target replay the kept latents into
its caches as the source made them. Exact while the replay spans the caches' depth (every
cached attention in the forward: the tiny model's 2 self-attentions and 1 mouse attention, so
3 chunks); a shorter one is close, and closer with every chunk after it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model.wan.tiny_dir import load_tiny
from tests.model.wan.tiny_mg_dir import HEIGHT, WIDTH
from worldserve.model.wan.matrix_game import MatrixGameRunner
from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    ChunkWork,
    ModelState,
    SessionSpec,
    SessionUpdate,
    StepPlan,
)
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import restore, snapshot

BUCKET, SEED = HEIGHT, 7


def runner(mg_dir: Path, dtype: str = "float32") -> MatrixGameRunner:
    r = load_tiny("matrix-game-2", mg_dir, dtype=dtype)
    assert isinstance(r, MatrixGameRunner)
    return r


def keeping(r: MatrixGameRunner, decoder_context: int) -> MatrixGameRunner:
    """A runner on ``r``'s parts that keeps ``decoder_context`` latent frames."""
    return MatrixGameRunner(r.model, r.decoder, r.clip, sizes=((HEIGHT, WIDTH),), decoder_context=decoder_context)


def actions(r: MatrixGameRunner, block: int, rng: np.random.Generator) -> np.ndarray:
    """A different key and mouse delta every pixel frame: any action misplaced in time shows."""
    n = r.first_chunk_frames if block == 0 else r.frames_per_chunk
    a = np.zeros((n, ACTION_DIM), np.float32)
    a[np.arange(n), rng.integers(0, 4, n)] = 1
    a[:, 4:] = rng.uniform(-1, 1, (n, 2))
    return a


def run(r: MatrixGameRunner, blocks: range, rng: np.random.Generator) -> tuple[list[np.ndarray], list[torch.Tensor]]:
    """Each block's frames and its clean latents."""
    frames, latents = [], []
    for b in blocks:
        out = r.execute(StepPlan(batches=[Batch(BUCKET, r.max_steps, [ChunkWork("s", b, actions(r, b, rng))])]))
        assert not out.errors, out.errors
        frames.append(out.results[0].frames)
        latents.append(torch.stack(list(r.sessions["s"].recent)[-r.cfg.chunk_frames:]))
    return frames, latents


def through_snapshot(state: ModelState) -> ModelState:
    session = Session.create(SessionConfig(fps=16.0, bucket=BUCKET, steps=3), scene="")[0]
    return restore(snapshot(session, state))[1]


def migrate(src: MatrixGameRunner, dst: MatrixGameRunner, blocks: int, after: int, *, observe_at: int | None = None,
            state_edit=None,
            ) -> tuple[tuple[list[np.ndarray], list[torch.Tensor]], tuple[list[np.ndarray], list[torch.Tensor]]]:
    """Run ``blocks`` blocks on ``src`` (an observation before block ``observe_at``), move the
    session to ``dst`` through snapshot bytes, then run ``after`` more blocks on both."""
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, "")]))
    rng = np.random.default_rng(0)
    for b in range(blocks):
        if b == observe_at:
            seen = np.random.default_rng(5).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
            assert not src.execute(StepPlan(updates=[SessionUpdate("s", observation=seen)])).errors
        run(src, range(b, b + 1), rng)
    state = through_snapshot(src.export_state("s"))
    if state_edit is not None:
        state_edit(state)
    out = dst.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, "", restore=state)]))
    assert not out.errors, out.errors
    later = range(blocks, blocks + after)
    return run(src, later, np.random.default_rng(1)), run(dst, later, np.random.default_rng(1))


@pytest.mark.parametrize(("dtype", "observe_at"), [("float32", None), ("float32", 3), ("bfloat16", None)])
def test_a_restored_session_makes_exactly_the_frames_of_the_undisturbed_one(
    mg_dir: Path, dtype: str, observe_at: int | None
) -> None:
    # 6 blocks: the window (one chunk) has rolled five times; with an observation before
    # block 3 the anchor is at latent frame 6 and the history counts from there
    (want, _), (got, _) = migrate(runner(mg_dir, dtype), runner(mg_dir, dtype), 6, 4, observe_at=observe_at)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_snapshot_carries_the_actions_and_the_anchors_frame(mg_dir: Path) -> None:
    src = runner(mg_dir)
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, "")]))
    rng = np.random.default_rng(0)
    run(src, range(2), rng)
    seen = np.full((HEIGHT, WIDTH, 3), 200, np.uint8)
    assert not src.execute(StepPlan(updates=[SessionUpdate("s", observation=seen)])).errors
    sent = [actions(src, b, np.random.default_rng(b)) for b in (2, 3)]
    for b, a in zip((2, 3), sent, strict=True):
        assert not src.execute(StepPlan(batches=[Batch(BUCKET, 3, [ChunkWork("s", b, a)])])).errors
    trace = through_snapshot(src.export_state("s")).family_state
    assert int(trace["action_anchor_frame"]) == 4 and int(trace["action_first"]) == 0
    # model frames 0..3 since the anchor: pixel frames 0..12, the newest 13 rows of the two blocks
    forward = np.concatenate(sent)[-13:, :4]
    np.testing.assert_array_equal(trace["action_keyboard"], forward)
    np.testing.assert_allclose(trace["action_mouse"], np.concatenate(sent)[-13:, [5, 4]] * [-0.1, 0.1], rtol=1e-6)


def test_past_the_kept_latents_the_replay_is_exact_once_it_spans_the_caches_depth(mg_dir: Path) -> None:
    base = runner(mg_dir)
    # 3 chunks kept (6 latent frames of 12 made) replay the 3 cached attentions' depth: the
    # caches come back exactly, so the latents do (the VAE stream, primed from 6 of its 37
    # frames of reach, does not: its pixels are not compared here)
    (_, want), (_, got) = migrate(keeping(base, 6), keeping(base, 6), 6, 4)
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a, b)
    # the default keeps 40 latent frames: past them (44 made) latents and pixels are exact
    (want_px, _), (got_px, _) = migrate(base, runner(mg_dir), 22, 2)
    for a, b in zip(want_px, got_px, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_replay_shorter_than_the_depth_is_close_and_closes_in(mg_dir: Path) -> None:
    base = runner(mg_dir)
    (_, want), (_, got) = migrate(keeping(base, 4), keeping(base, 4), 6, 4)  # 2 chunks of the 3
    diff = [float((a - b).abs().max()) for a, b in zip(want, got, strict=True)]
    scale = float(torch.stack(want).abs().max())
    assert 0 < diff[0] < 0.01 * scale, (diff, scale)
    assert diff[-1] < diff[0] / 10, diff  # each chunk after the restore recomputes one level more


def test_without_the_action_trace_the_restore_goes_another_way(mg_dir: Path) -> None:
    # an older worker's snapshot: the window re-cached with nothing held, from frame 0
    def drop(state: ModelState) -> None:
        state.family_state = {}

    (want, _), (got, _) = migrate(runner(mg_dir), runner(mg_dir), 4, 4, state_edit=drop)
    diff = [float(np.abs(a.astype(int) - b).mean()) for a, b in zip(want, got, strict=True)]
    assert diff[0] > 0 and max(diff) > 0.5, diff  # from the next block on, and growing apart


def test_an_action_trace_that_does_not_fit_fails_that_session_only(mg_dir: Path) -> None:
    src = runner(mg_dir)
    src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, SEED, "")]))
    run(src, range(3), np.random.default_rng(0))
    dst = runner(mg_dir)
    short = src.export_state("s")
    fs = short.family_state
    fs["action_keyboard"], fs["action_mouse"] = fs["action_keyboard"][1:], fs["action_mouse"][1:]
    wide = src.export_state("s")
    wide.family_state["action_keyboard"] = np.zeros((len(wide.family_state["action_keyboard"]), 7), np.float32)
    out = dst.execute(StepPlan(new_sessions=[
        SessionSpec("short", BUCKET, SEED, "", restore=short), SessionSpec("wide", BUCKET, SEED, "", restore=wide),
        SessionSpec("fresh", BUCKET, SEED, ""),
    ]))
    assert "cover pixel frames 0..19" in out.errors["short"] and "made 21" in out.errors["short"]
    assert "matrix_game.action_keyboard: expected float32 (N, 4)" in out.errors["wide"]
    assert "fresh" not in out.errors and set(dst.sessions) == {"fresh"}
