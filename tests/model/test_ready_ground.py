"""A served session's canvas is made with its start frame, off the model thread
(``GroundPainter.ready``, ``StartViews``): the model thread then opens it and draws its first
frame without encoding, filling or decoding anything, and a canvas whose frame never comes
back gives its queued work up."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model.conftest import key_action, make_runner, run_chunks, tiny_config
from worldserve.model.default.reference.canvas.canvas import TILE_UNITS
from worldserve.model.default.reference.canvas.ground import GroundPainter, SessionGround
from worldserve.model.default.reference.canvas.tile_decode import DecodeCounts
from worldserve.model.default.reference.start_views import StartViews
from worldserve.session.plan import SessionSpec, StepPlan
from worldserve.world import start_frame, start_views
from worldserve.world.scene import SceneAttrs

BUCKET = 64
SCENE = "a grassy village by day"


def test_the_model_thread_opens_a_served_session_and_draws_its_first_frame_with_nothing_left_to_do() -> None:
    painter = GroundPainter.load(torch.device("cpu"))  # its own decoder's thread: counts of its own
    painter.ready_wait = 60.0  # a busy test machine may take more than a server's half second
    try:
        runner = make_runner(tiny_config(), ground=painter, start_frame=start_frame, start_views=start_views)
        first = runner.first_frame(SCENE, 4, BUCKET)  # a server's worker thread
        assert first is not None
        before = painter.decoder.counts.copy()
        runner.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 4, SCENE, observation=first)]))
        run_chunks(runner, 0, [key_action(0)])
        done = painter.decoder.counts.since(before)
        assert (done.inline, done.inline_fills) == (0, 0)  # nothing decoded or filled on this thread
        g = runner.sessions["s"].ref
        assert isinstance(g, SessionGround) and len(g.pixels) >= 4
    finally:
        painter.close()


def test_a_client_s_start_observation_is_made_ready_off_the_model_thread_to_the_same_canvas_and_frames() -> None:
    painter = GroundPainter.load(torch.device("cpu"))
    painter.ready_wait = 60.0  # a busy test machine may take more than a server's half second
    try:
        view = start_frame(SCENE, 6, BUCKET)  # a client's frame: encoded as seen
        path = [key_action(1)] * 4 + [key_action(3)] * 4
        runs = []
        for ready in (False, True):
            runner = make_runner(tiny_config(), ground=painter, start_frame=start_frame, start_views=start_views)
            if ready:
                runner.ready_observation(SCENE, 6, BUCKET, view.copy())  # a server's worker thread
            before = painter.decoder.counts.copy()
            runner.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 6, SCENE, observation=view.copy())]))
            frames = run_chunks(runner, 0, path[:1])
            done = painter.decoder.counts.since(before)
            frames += run_chunks(runner, 1, path[1:])
            g = runner.sessions["s"].ref
            assert isinstance(g, SessionGround)
            runs.append((frames, g.canvas.to_arrays(), done.inline + done.inline_fills))
        (plain, canvas_a, _), (made, canvas_b, inline) = runs
        assert inline == 0  # the ready one's first frame: nothing encoded, filled or decoded there
        assert all(np.array_equal(a, b) for a, b in zip(plain, made, strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(canvas_a, canvas_b, strict=True))
    finally:
        painter.close()


@pytest.mark.parametrize("direction", [(-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (1, 1)])
def test_a_ready_session_s_first_moves_any_way_find_their_tiles_decoded(direction: tuple[int, int]) -> None:
    """The view starts on a tile's edges: a first step up or left reaches the ring around the
    view's tiles. ``ready`` waits for those too, so the model thread decodes nothing in the
    first 31 units of travel, whichever way (it decoded them inline while every running
    session waited, 11-33 ms a tile, docs/performance.md)."""
    painter = GroundPainter.load(torch.device("cpu"))
    try:
        view = start_views(SCENE, 5, BUCKET)[1]
        g = painter.ready(5, SceneAttrs(), view, wait=30.0)
        with painter.busy():  # from here the decoder's thread starts nothing more
            before = painter.decoder.counts.copy()
            step = np.array(direction, np.float64) * (TILE_UNITS / 2 - 1) / 8
            painter.reference(g, g.position + step * np.arange(1, 9)[:, None], BUCKET)  # 8 frames, 31 units
            done = painter.decoder.counts.since(before)
            assert (done.inline, done.waited) == (0, 0)
        painter.release(g)
    finally:
        painter.close()


def test_a_canvas_made_for_a_frame_that_never_comes_back_gives_its_queued_work_up() -> None:
    painter = GroundPainter.load(torch.device("cpu"))
    released: list[object] = []

    def release(g: object) -> None:
        released.append(g)
        painter.release(g)  # type: ignore[arg-type]

    def no_wait(scene: str, seed: int, view: np.ndarray, seen: bool) -> SessionGround:
        return painter.ready(seed, SceneAttrs(), view, seen, wait=0.0)

    try:
        with painter.busy():  # the decoder's thread starts nothing: the look-ahead stays queued
            starts = StartViews(start_frame, start_views, keep=1, release=release, ready=no_wait)
            a = starts.frame(SCENE, 1, BUCKET)
            starts.frame(SCENE, 2, BUCKET)  # keeps one: the first one's canvas goes
            assert len(released) == 1
            gone = released[0]
            assert isinstance(gone, SessionGround) and not gone.ahead and gone.filling is None
            # a start with another observation than the frame handed out: not its canvas
            other = SessionSpec("s", BUCKET, 2, SCENE, observation=np.zeros_like(a))
            assert starts.take(other) is None and len(released) == 2
            b = starts.frame(SCENE, 3, BUCKET)
            kept = starts.take(SessionSpec("s", BUCKET, 3, SCENE, observation=b))
            assert kept is not None and isinstance(kept.ready, SessionGround) and len(released) == 2
            painter.release(kept.ready)
            # many frames out at once: the newest few keep their canvases, every one its ground
            many = StartViews(start_frame, start_views, keep=4, keep_ready=2, release=release, ready=no_wait)
            frames = {seed: many.frame(SCENE, seed, BUCKET) for seed in (10, 11, 12)}
            assert len(released) == 3  # seed 10's canvas
            oldest = many.take(SessionSpec("s", BUCKET, 10, SCENE, observation=frames[10]))
            assert oldest is not None and oldest.ready is None and oldest.ground.shape == (BUCKET, BUCKET, 3)
            newest = many.take(SessionSpec("s", BUCKET, 12, SCENE, observation=frames[12]))
            assert newest is not None and isinstance(newest.ready, SessionGround)
    finally:
        painter.close()


def test_waiting_for_the_decoder_s_thread_is_bounded_and_takes_nothing_back() -> None:
    painter = GroundPainter.load(torch.device("cpu"))
    try:
        with painter.busy():  # a saturated model: the decoder's thread gets no gap
            view = start_views(SCENE, 5, BUCKET)[1]
            g = painter.ready(5, SceneAttrs(), view, wait=0.05)
            assert g.filling is not None and not g.filling.future.done()  # still queued: left to the model thread
            assert painter.decoder.counts.since(DecodeCounts()).inline_fills == 0
            painter.release(g)
    finally:
        painter.close()
