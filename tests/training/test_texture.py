"""The texture term (``training/texture.py``): it tells a world frame from its blur, its blocks
and a flat fill but hardly from the same ground moved, it stays bounded, it drives a flat guess
toward the reference's detail, it reaches only the pixels it may, and training runs with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tests.training.test_train import TINY, _config
from worldserve.training.texture import WIDTHS, TextureLoss, TexturePyramid
from worldserve.training.train import train
from worldserve.world import World, parse_prompt


def _world_frames(n: int, seed: int = 3) -> torch.Tensor:
    """(n, 3, 64, 64) renderer frames in [-1, 1] along a walk (a forest: busy ground)."""
    world = World(seed, parse_prompt("grassland dense summer day"), (64,), map_size=512)
    rng = np.random.default_rng(seed)
    world.reset(world.random_position(rng))
    out = []
    for _ in range(n):
        for _ in range(12):  # far enough apart that the frames share little ground
            world.step(np.array([1, 0, 0, 0, 0.0, 0.0], np.float32))
        out.append(world.render(64))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float() / 127.5 - 1


def _sharpness(x: torch.Tensor) -> float:
    return float(
        (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean()
    )


def test_the_statistics_ignore_where_the_ground_is_and_see_what_it_is_made_of() -> None:
    tex = TextureLoss()
    real = _world_frames(4)
    moved = torch.roll(real, (8, -8), (-2, -1))
    blur = F.avg_pool2d(F.pad(real, (2, 2, 2, 2), mode="reflect"), 5, 1)
    blocks = F.interpolate(F.avg_pool2d(real, 16), scale_factor=16, mode="nearest")
    flat = real.mean(dim=(2, 3), keepdim=True).expand_as(real)
    d = {
        name: float(tex.distance(x, real).mean())
        for name, x in (
            ("same", real),
            ("moved", moved),
            ("blur", blur),
            ("blocks", blocks),
            ("flat", flat),
        )
    }
    assert d["same"] < 1e-6
    assert d["moved"] < 0.5 * d["blur"]  # placement matters far less than blur
    assert d["blur"] < d["blocks"] < d["flat"]  # and the flatter, the further


def test_the_distance_is_bounded_and_symmetric_in_scale() -> None:
    tex = TextureLoss()
    real = _world_frames(2)
    stripes = torch.zeros_like(real)
    stripes[..., ::2, :] = 1.0
    stripes[..., 1::2, :] = -1.0  # saturated stripes beside calm ground: large, not unbounded
    levels = 1 + len(WIDTHS)
    assert float(tex.distance(stripes, real).max()) <= 2 * 2 * levels
    assert float(tex.distance(real * 0.0, real).max()) <= 2 * 2 * levels


def test_the_pyramid_is_fixed_and_the_same_for_every_instance() -> None:
    a, b = TexturePyramid(), TexturePyramid()
    assert all(not p.requires_grad for p in a.parameters())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    x = _world_frames(1)
    assert [m.shape[1] for m, _ in a(x)] == [3, *WIDTHS]  # the pixels' colour, then every level


def test_the_term_drives_a_flat_guess_toward_the_references_detail() -> None:
    tex = TextureLoss(frames=4)
    real = _world_frames(4)
    g = torch.Generator().manual_seed(0)
    guess = (
        (
            real.mean(dim=(2, 3), keepdim=True).expand_as(real)
            + 0.01 * torch.randn(real.shape, generator=g)
        )
        .clone()
        .requires_grad_(True)
    )
    opt = torch.optim.Adam([guess], lr=0.02)
    first = float(tex.distance(guess.detach(), real).mean())
    for _ in range(60):
        loss = tex.loss(guess[None], real[None], g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    last = float(tex.distance(guess.detach(), real).mean())
    assert last < 0.5 * first
    assert _sharpness(guess.detach()) > 0.5 * _sharpness(real)  # detail, not the mean it started as
    assert float(F.mse_loss(guess.detach(), real)) > 0.01  # made of the same, not the same pixels


def test_the_term_moves_only_the_pixels_it_may_reach_and_only_the_frames_it_picked() -> None:
    tex = TextureLoss(frames=3)
    real = _world_frames(5)
    pred = F.avg_pool2d(real, 5, 1, 2)[None].clone().requires_grad_(True)
    reach = torch.zeros(1, 5, 1, 64, 64)
    reach[..., :, 48:] = 1.0  # say, the strip the camera just brought into view
    loss = tex.loss(pred, real[None], torch.Generator().manual_seed(0), reach)
    loss.backward()
    assert pred.grad is not None
    assert pred.grad[..., :48].abs().sum() == 0 and pred.grad[..., 48:].abs().sum() > 0
    assert (pred.grad.abs().sum(dim=(2, 3, 4)) > 0).sum() == 3
    again = tex.loss(pred.detach(), real[None], torch.Generator().manual_seed(0))
    assert torch.allclose(loss, again)  # the statistics are the whole frame's all the same


def test_training_runs_with_the_texture_term_and_reports_it(tmp_path: Path, capsys) -> None:
    tc = _config(tmp_path, 3, rollout_after=0)
    tc.self_rollout_share, tc.model, tc.texture_weight = 0.5, TINY, 0.01
    report = train(tc, resume=False, export=None)
    assert np.isfinite(report["loss_last_10_this_run"])
    got = [float(w.split("=")[1]) for w in capsys.readouterr().err.split() if w.startswith("texture=")]
    assert len(got) == 3 and all(0.0 < v <= 20.0 for v in got)  # on the progress line, every step
