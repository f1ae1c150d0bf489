"""Matrix-Game 2.0's runner at a tiny random size, loaded through ``--model matrix-game-2
--weights DIR``'s path (model/registry.py): block sizes and controls, keys and mouse change
the picture, an observation re-anchors, a snapshot restores, the layout's errors name files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.model.wan.tiny_dir import load_tiny
from tests.model.wan.tiny_mg_dir import HEIGHT, WIDTH
from worldserve.model.registry import check
from worldserve.model.wan.matrix_game import MatrixGameRunner, fit_frame
from worldserve.session.options import RunnerInfo
from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    ChunkWork,
    SessionSpec,
    SessionUpdate,
    StepPlan,
)

BUCKET = HEIGHT


@pytest.fixture(scope="module")
def runner(mg_dir: Path) -> MatrixGameRunner:
    r = load_tiny("matrix-game-2", mg_dir)
    assert isinstance(r, MatrixGameRunner)
    return r


def held(runner: MatrixGameRunner, block: int, keys: tuple[int, ...] = (),
         mouse: tuple[float, float] = (0, 0)) -> np.ndarray:
    n = runner.first_chunk_frames if block == 0 else runner.frames_per_chunk
    act = np.zeros((n, ACTION_DIM), np.float32)
    act[:, list(keys)] = 1
    act[:, 4:] = mouse
    return act


def run(runner: MatrixGameRunner, sid: str, blocks: range, **kw) -> list[np.ndarray]:
    frames = []
    for b in blocks:
        work = [ChunkWork(sid, b, held(runner, b, **kw))]
        out = runner.execute(StepPlan(batches=[Batch(BUCKET, runner.max_steps, work)]))
        assert not out.errors, out.errors
        frames.append(out.results[0].frames)
    return frames


def open_(runner: MatrixGameRunner, *sids: str, seed: int = 1, observation: np.ndarray | None = None) -> None:
    specs = [SessionSpec(s, BUCKET, seed, "a quiet lake", observation) for s in sids]
    out = runner.execute(StepPlan(new_sessions=specs))
    assert not out.errors, out.errors


def test_blocks_controls_and_the_recipe_come_from_the_authors_config(runner: MatrixGameRunner) -> None:
    info = RunnerInfo.of(runner, (1,))
    assert (info.first_chunk_frames, info.frames_per_chunk) == (5, 8)  # 2 latent frames a chunk
    assert info.controls == ("keys", "mouse", "observation") and info.frame_size(BUCKET) == (HEIGHT, WIDTH)
    assert runner.variant == "universal" and runner.max_steps == 3
    assert runner.cfg.step_timesteps[1:] == pytest.approx((908.84, 713.98), abs=0.01)
    first = runner.first_frame("a quiet lake", 3, BUCKET)
    assert first is not None and first.shape == (HEIGHT, WIDTH, 3) and first.dtype == np.uint8


def test_held_keys_and_the_mouse_each_move_the_picture_away_from_no_input(runner: MatrixGameRunner) -> None:
    open_(runner, "still", "fwd", "look")
    still = run(runner, "still", range(3))
    fwd = run(runner, "fwd", range(3), keys=(0,))
    look = run(runner, "look", range(3), mouse=(1.0, 0.0))
    diff = lambda xs: [float(np.abs(a.astype(int) - b).mean()) for a, b in zip(still, xs, strict=True)]  # noqa: E731
    assert min(diff(fwd)) > 0.5, diff(fwd)  # a held key changes every block
    assert min(diff(look)) > 0.05 and diff(look)[-1] > diff(look)[0], diff(look)  # the camera's 0.1 a frame, growing
    for s in ("still", "fwd", "look"):
        runner.free(s)


def test_the_same_inputs_make_the_same_frames_alone_or_batched(runner: MatrixGameRunner) -> None:
    open_(runner, "a", "b", seed=5)
    open_(runner, "c", seed=5)
    for b in range(3):
        out = runner.execute(StepPlan(batches=[Batch(BUCKET, 3, [ChunkWork("a", b, held(runner, b, (0,))),
                                                               ChunkWork("b", b, held(runner, b, (2,), (0.5, 0)))])]))
        solo = runner.execute(StepPlan(batches=[Batch(BUCKET, 3, [ChunkWork("c", b, held(runner, b, (0,)))])]))
        assert not out.errors and not solo.errors
        np.testing.assert_allclose(out.results[0].frames, solo.results[0].frames, atol=1)
    for s in "abc":
        runner.free(s)


def test_an_observation_anchors_a_session_and_a_later_one_re_anchors_it(runner: MatrixGameRunner) -> None:
    red, blue = np.zeros((HEIGHT, WIDTH, 3), np.uint8), np.zeros((64, 96, 3), np.uint8)
    red[..., 0], blue[..., 2] = 220, 220
    open_(runner, "r1", "r2", observation=red)
    a, b = run(runner, "r1", range(2)), run(runner, "r2", range(2))
    np.testing.assert_array_equal(a[1], b[1])
    assert np.array_equal(runner.sessions["r1"].anchor.image, red)  # type: ignore[attr-defined]
    out = runner.execute(StepPlan(updates=[SessionUpdate("r2", observation=blue)]))
    assert not out.errors
    s = runner.sessions["r2"]
    assert s.anchor.frame == s.frame_index == 2 + 2  # type: ignore[attr-defined]
    assert runner.pools[BUCKET].held(s.slot)[0].size == 0
    np.testing.assert_array_equal(s.anchor.image, fit_frame(blue, HEIGHT, WIDTH))  # type: ignore[attr-defined]
    a2, b2 = run(runner, "r1", range(2, 4)), run(runner, "r2", range(2, 4))
    assert [x.shape[0] for x in b2] == [8, 8]  # blocks keep their size across the re-anchor
    assert np.abs(a2[0].astype(int) - b2[0]).mean() > 0.5
    runner.free("r1")
    runner.free("r2")


def test_a_snapshot_restores_on_another_runner_with_its_anchor_image(runner: MatrixGameRunner, mg_dir: Path) -> None:
    open_(runner, "m", seed=9)
    run(runner, "m", range(4), keys=(0,))
    st = runner.export_state("m")
    assert st.family == "matrix-game-2" and st.frames.shape == (1, HEIGHT, WIDTH, 3) and st.frame_index == 8
    other = load_tiny("matrix-game-2", mg_dir)
    out = other.execute(StepPlan(new_sessions=[SessionSpec("m", BUCKET, 9, "", restore=st)]))
    assert not out.errors, out.errors
    got = run(other, "m", range(4, 6), keys=(0,))
    assert [g.shape for g in got] == [(8, HEIGHT, WIDTH, 3)] * 2
    np.testing.assert_array_equal(other.sessions["m"].anchor.image, st.frames[0])  # type: ignore[attr-defined]
    runner.free("m")


def test_the_layout_names_a_missing_image_encoder_and_a_text_model(mg_dir: Path, tmp_path: Path) -> None:
    check("matrix-game-2", mg_dir)
    broken = tmp_path / "broken"
    shutil.copytree(mg_dir, broken)
    shutil.rmtree(broken / "image_encoder")
    with pytest.raises(FileNotFoundError, match=r"models_clip_open-clip-xlm-roberta-large-vit-huge-14\.pth does not "
                                               r"exist, nor .*image_encoder/ .*Skywork/Matrix-Game-2\.0"):
        check("matrix-game-2", broken)
    (broken / "image_encoder").mkdir()
    with pytest.raises(FileNotFoundError, match=r"image_encoder/config.json does not exist"):
        check("matrix-game-2", broken)
    with pytest.raises(ValueError, match="needs --weights DIR"):
        check("matrix-game-2", None)
