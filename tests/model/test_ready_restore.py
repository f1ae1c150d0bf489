"""A restored session's canvas is rebuilt off the model thread (``ModelRunner.ready_restore``,
``GroundPainter.ready_restore``, ``ReadyRestores``): the model thread restores it and draws
its first frames without decoding a tile, and the frames are the ones a canvas rebuilt on the
model thread gives."""

from __future__ import annotations

import numpy as np
import torch

from tests.model.conftest import key_action, make_runner, run_chunks, tiny_config
from worldserve.model.default.reference.canvas.ground import GroundPainter, SessionGround
from worldserve.model.default.reference.canvas.reference import CanvasReference
from worldserve.model.default.reference.canvas.restores import ReadyRestores
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import SessionSpec, StepPlan

BUCKET = 64
SCENE = "a grassy village by day"


def test_a_snapshot_made_ready_off_the_model_thread_restores_with_nothing_decoded_there_to_the_same_frames() -> None:
    painter = GroundPainter.load(torch.device("cpu"))
    painter.ready_wait = 60.0  # a busy test machine may take more than a server's half second

    def runner() -> ModelRunner:
        return make_runner(tiny_config(), ground=painter)

    try:
        src = runner()
        src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, SCENE)]))
        run_chunks(src, 0, [key_action(0)] * 9 + [key_action(3)] * 5)  # off the tile grid, new ground on the way
        state = src.export_state("s")
        assert "canvas_codes" in state.family_state
        later = [key_action(1)] * 3 + [key_action(2)] * 3
        runs = []
        for ready in (False, True):
            dst = runner()
            if ready:
                dst.ready_restore(state)  # a server's worker thread, before the session is scheduled
                assert len(dst.ref.restores) == 1
            before = painter.decoder.counts.copy()
            dst.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, SCENE, restore=state)]))
            first = run_chunks(dst, 14, later[:1])
            done = painter.decoder.counts.since(before)
            runs.append((first + run_chunks(dst, 15, later[1:]), done.inline + done.inline_fills + done.waited))
            assert len(dst.ref.restores) == 0
        (plain, inline_plain), (made, inline_made) = runs
        assert inline_plain > 0  # rebuilt there, the model thread decoded the view's tiles itself
        assert inline_made == 0  # nor waited for there
        assert all(np.array_equal(a, b) for a, b in zip(plain, made, strict=True))
    finally:
        painter.close()


def test_a_snapshot_restored_under_another_look_is_rebuilt_and_its_ready_canvas_released() -> None:
    painter = GroundPainter.load(torch.device("cpu"))
    try:
        src = make_runner(tiny_config(), ground=painter)
        src.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 3, SCENE)]))
        run_chunks(src, 0, [key_action(0)] * 2)
        state = src.export_state("s")
        dst = make_runner(tiny_config(), ground=painter)
        dst.ready_restore(state)
        assert isinstance(dst.ref, CanvasReference)
        made = dst.ref.restores._kept[id(state.family_state["canvas_codes"])][1]
        other = "a snowy desert at night"  # another look: the ready canvas's codes are not its
        dst.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 3, other, restore=state)]))
        g = dst.sessions["s"].ref
        assert isinstance(g, SessionGround) and g is not made and g.look != made.look
        assert not made.pixels and not made.ahead  # released
    finally:
        painter.close()


def test_ready_restores_keep_the_newest_and_release_the_rest() -> None:
    released: list[str] = []
    kept = ReadyRestores(released.append, keep=2)

    def state() -> np.ndarray:  # what a snapshot is found by: its canvas codes array
        return np.zeros((0, 16, 16), np.uint16)

    a, b, c = state(), state(), state()
    kept.put(a, "A")
    kept.put(b, "B")
    kept.put(c, "C")  # past two: the oldest goes
    assert released == ["A"] and len(kept) == 2
    assert kept.take(a, lambda g: True) is None  # released already
    assert kept.take(state(), lambda g: True) is None  # an equal snapshot is not the same one
    assert kept.take(b, lambda g: False) is None and released == ["A", "B"]  # made for another look
    assert kept.take(c, lambda g: True) == "C" and len(kept) == 0
    kept.put(a, "A1")
    kept.put(a, "A2")  # made again for the same snapshot: the first one goes
    assert released == ["A", "B", "A1"] and kept.take(a, lambda g: True) == "A2"
