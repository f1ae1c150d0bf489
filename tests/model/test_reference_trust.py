"""The reference trust (``ModelConfig.reference_trust``, ``dit.trusted_mix``): a serving setting
that makes the head copy more of its reference (a world canvas) and add less of its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model.conftest import make_runner, randomized, run_chunks, scene_encoder_for, tiny_config
from tests.model.test_ground import BUCKET, SCENE, _painter, _psnr
from worldserve.model.default.net.dit import trusted_mix
from worldserve.model.default.reference.canvas.ground import TRUST
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import save_model
from worldserve.model.registry import LoadOptions
from worldserve.server.settings import Settings
from worldserve.session.plan import ACTION_DIM, SessionSpec, StepPlan


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logit = torch.randn(2, 1, 8, 8, generator=g) * 3 - 2  # (B*F, 1, H, W), B=2, F=1
    mask = torch.ones(2, 1, 8, 8)
    mask[1, :, :, 4:] = 0  # the second frame's reference covers its left half
    resid = torch.randn(2, 1, 3, 8, 8, generator=g)
    return logit, mask, resid


def test_no_trust_is_the_head_as_trained_and_more_trust_copies_more() -> None:
    logit, mask, resid = _inputs()
    mix, kept = trusted_mix(logit, mask, resid, 0.0)
    assert torch.allclose(mix, logit.sigmoid() * mask) and torch.allclose(kept, resid)
    last = mix
    for trust in (1.0, 4.0, 30.0):
        mix, kept = trusted_mix(logit, mask, resid, trust)
        assert (mix >= last - 1e-7).all()  # every pixel copies at least as much as with less trust
        assert (kept.abs() <= resid.abs() + 1e-7).all()  # and adds no more of its own
        last = mix
    # at full trust the covered pixels are the reference's alone; uncovered ones are untouched
    assert torch.allclose(mix, mask, atol=1e-6)
    covered = mask.view(2, 1, 1, 8, 8).expand_as(resid) == 1
    assert kept[covered].abs().max() < 1e-5
    assert torch.equal(kept[~covered], resid[~covered])


def test_the_setting_is_checked() -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="reference_trust"):
            tiny_config(reference_trust=bad)


def test_a_trusting_compositor_shows_the_canvas_under_it() -> None:
    """Untrained weights copy next to nothing of the canvas (their mix starts at 0.25 %); the
    same weights at a full trust draw the canvas's ground under the camera."""
    def last_frame_and_ground(trust: float) -> tuple[np.ndarray, np.ndarray]:
        runner = make_runner(tiny_config(reference_trust=trust), ground=_painter())
        runner.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, 9, SCENE)]))
        frame = run_chunks(runner, 0, [np.zeros((1, ACTION_DIM), np.float32)] * 3)[-1]
        g = runner.sessions["s"].ref
        assert g is not None
        ref = _painter().reference(g, g.position[None], BUCKET)[0, :3]
        return frame, ((ref.permute(1, 2, 0).numpy() + 1) * 127.5).clip(0, 255).astype(np.uint8)

    frame, ground = last_frame_and_ground(0.0)
    assert _psnr(frame, ground) < 20
    frame, ground = last_frame_and_ground(30.0)
    assert _psnr(frame, ground) > 40


def test_the_server_s_canvas_trust_reaches_the_canvas_runner_alone(tmp_path: Path) -> None:
    cfg = tiny_config()
    path = save_model(randomized(cfg), tmp_path / "w.safetensors")
    kw = {"scene_encoder": scene_encoder_for(cfg), "max_sessions": 1}
    assert ModelRunner.from_pretrained(path, canvas=True, canvas_trust=2.0, **kw).cfg.reference_trust == 2.0
    assert ModelRunner.from_pretrained(path, canvas=True, **kw).cfg.reference_trust == TRUST  # served
    # the anchor: as trained
    assert ModelRunner.from_pretrained(path, canvas_trust=2.0, **kw).cfg.reference_trust == 0.0
    # the server's setting and the registry's option default to the served trust
    assert Settings().canvas_trust == LoadOptions().canvas_trust == TRUST > 0
    with pytest.raises(ValueError, match="reference_trust"):
        ModelRunner.from_pretrained(path, canvas=True, canvas_trust=-1.0, **kw)
