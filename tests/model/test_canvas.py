"""The canvas (``canvas_memory``): ground is written the first time a frame shows it and read
back where the camera is, as the anchor reference reads its frame; a place the camera left
and came back to reads as it was; a far place that lands on the same cells reads as unseen;
serving sessions keep one canvas each and drop it on a prompt change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.anchor import anchor_reference
from model.canvas import CANVAS_SPAN, REDRAW, Canvas
from session.plan import ACTION_DIM, KEYS, Batch, ChunkWork, SessionSpec, SessionUpdate, StepPlan
from tests.model.conftest import make_runner, tiny_config


def _frame(seed: int, size: int = 16) -> torch.Tensor:
    return torch.rand(3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_canvas_memory_needs_the_anchor() -> None:
    with pytest.raises(ValueError, match="canvas_memory needs anchor_warp"):
        tiny_config(canvas_memory=True)


def test_a_written_frame_reads_back_as_the_anchor_reference_reads_it() -> None:
    frame = _frame(0)
    canvas = Canvas.blank(3, 16, torch.float32, torch.device("cpu"))
    canvas.write(frame, torch.zeros(2, dtype=torch.float64))
    for dy, dx in ((0.0, 0.0), (2.0, -3.0), (1.5, 0.25), (-7.0, 3.75)):
        off = torch.tensor([dy, dx], dtype=torch.float64)
        got = canvas.read(off, 16)
        want = anchor_reference(frame[None], off[None].float())[0]
        assert torch.equal(got[3] > 0, want[3] > 0), (dy, dx)
        assert torch.allclose(got, want, atol=1e-5), (dy, dx)


def test_ground_is_written_once_new_ground_is_added_and_changed_ground_redrawn() -> None:
    first = _frame(1)
    second = _frame(2)
    second[:, :, :12] = first[:, :, 4:] + 0.1  # the camera moved 4 px right; the carried part a little off
    second[:, 8:, :4] = -first[:, 8:, 4:8]  # ... and here something changed
    canvas = Canvas.blank(3, 16, torch.float32, torch.device("cpu"))
    canvas.write(first, torch.zeros(2, dtype=torch.float64))
    off = torch.tensor([0.0, -4.0], dtype=torch.float64)
    canvas.write(second, off)
    ref = canvas.read(off, 16)
    assert bool((ref[3] > 0).all())
    assert torch.allclose(ref[:3, :8, :12], first[:, :8, 4:])  # a small difference keeps the first drawing
    changed = (second[:, 8:, :4] - first[:, 8:, 4:8]).abs().amax(0) > REDRAW
    assert bool(changed.any())
    assert torch.allclose(ref[:3, 8:, :4][:, changed], second[:, 8:, :4][:, changed])  # a big one is redrawn
    assert torch.allclose(ref[:3, :, 12:], second[:, :, 12:])  # the new columns come from the second
    back = canvas.read(torch.zeros(2, dtype=torch.float64), 16)  # coming back reads the first, as kept
    assert torch.allclose(back[:3, :8], first[:, :8])


def test_a_far_place_on_the_same_cells_reads_as_unseen() -> None:
    canvas = Canvas.blank(3, 16, torch.float32, torch.device("cpu"))
    canvas.write(_frame(3), torch.zeros(2, dtype=torch.float64))
    side = CANVAS_SPAN * 16
    far = canvas.read(torch.tensor([0.0, -float(side)], dtype=torch.float64), 16)  # one canvas over
    assert float(far[3].sum()) == 0.0 and float(far[:3].abs().sum()) == 0.0
    canvas.write(_frame(4), torch.tensor([0.0, -float(side)], dtype=torch.float64))
    home = canvas.read(torch.zeros(2, dtype=torch.float64), 16)  # its cells now hold the far place
    assert float(home[3].sum()) == 0.0


def _canvas_runner():
    runner = make_runner(tiny_config(anchor_warp=True, canvas_memory=True))
    with torch.no_grad():  # a shift head that moves the scene 2 px left per "right" key
        runner.model.shift_head.weight.zero_()
        runner.model.shift_head.bias.zero_()
        runner.model.shift_head.weight[1, KEYS.index("right")] = -2.0
    return runner


def _step(runner, c: int, key: str | None) -> None:
    a = np.zeros((1, ACTION_DIM), np.float32)
    if key:
        a[0, KEYS.index(key)] = 1.0
    res = runner.execute(StepPlan(batches=[Batch(32, 2, [ChunkWork("s", c, a)])]))
    assert not res.errors


def test_a_serving_session_keeps_its_observation_on_the_canvas_and_drops_it_on_a_prompt_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import model.canvas

    monkeypatch.setattr(model.canvas, "REDRAW", 2.0)  # random weights re-draw everything: keep all
    runner = _canvas_runner()
    obs = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", observation=obs)]))
    s = runner.sessions["s"]
    assert s.canvas is not None and s.offset is not None and s.offset.dtype == torch.float64
    for c in range(40):  # 80 px right: past the 25 % an anchor frame would be dropped at
        _step(runner, c, "right")
    assert torch.allclose(s.offset, torch.tensor([0.0, -80.0], dtype=torch.float64))
    home = s.canvas.read(torch.zeros(2, dtype=torch.float64), 32)
    want = runner._encode(obs[None])[0]
    assert bool((home[3] > 0).all()) and torch.allclose(home[:3], want)  # the observation is still there
    runner.execute(StepPlan(updates=[SessionUpdate("s", scene="y")]))
    prev, _ = runner._prev_inputs([s], torch.zeros(1, 1, ACTION_DIM))
    assert float(prev[0, 0, 3:].abs().sum()) == 0.0  # the old scene's canvas is not read
