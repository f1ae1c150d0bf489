"""How the network lays the live state on a frame (``model/default/net/state_draw.py``) and how
the state's channels place an actor (``reference/live/channels.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldserve.model.default.chunk_graph import trace_body
from worldserve.model.default.net.state_draw import BLOCK, StateBasis, lay_state, state_kinds
from worldserve.model.default.reference.live.channels import (
    AXES,
    BOAT,
    HEADING_STEPS,
    STATE_CHANNELS,
    actor_channels,
)


def _one_boat(pos: tuple[float, float], heading: float) -> np.ndarray:
    out = np.zeros((STATE_CHANNELS, 64, 64), np.float32)
    actor_channels(out, np.array([BOAT]), np.array([0]), np.array([pos]), np.array([heading]), (0.0, 0.0), 1024)
    return out


def test_an_actor_is_laid_at_its_pixel_s_centre_and_its_heading_s_step() -> None:
    here = _one_boat((20.1, 30.2), 0.3)
    assert np.array_equal(here, _one_boat((20.9, 30.8), 0.3 + 0.9 * np.pi / HEADING_STEPS))  # same pixel, same step
    assert not np.array_equal(here, _one_boat((21.1, 30.2), 0.3))  # the next pixel
    assert not np.array_equal(here, _one_boat((20.1, 30.2), 0.3 + 2 * np.pi / HEADING_STEPS))  # the next step
    f = here[BOAT * AXES]
    assert f[20, 30] == f.max()  # the footprint peaks on the actor's own pixel


def test_the_layout_names_its_kinds_and_refuses_another() -> None:
    assert state_kinds(STATE_CHANNELS) == 2
    with pytest.raises(ValueError, match="layout"):
        state_kinds(STATE_CHANNELS + 1)


def test_the_learned_shapes_are_zero_where_no_actor_reaches_and_vary_where_one_does() -> None:
    torch.manual_seed(0)
    basis = StateBasis(STATE_CHANNELS, features=6)
    st = torch.from_numpy(_one_boat((32.0, 32.0), 0.0))[None]
    out = basis(st)[0]  # (kinds * 6, H, W)
    assert out.shape == (2 * 6, 64, 64)
    inside = st[0, BOAT * AXES] > 0
    assert torch.all(out[:, ~inside] == 0)
    assert torch.all(out[:6] == 0)  # no animal anywhere
    boat = out[6:, inside]
    assert boat.std(dim=1).min() > 0  # a function of the pixel's place, not one value per actor


def test_the_coefficients_are_interpolated_between_token_centres() -> None:
    b, f, ch, h, p, k = 1, 1, 3, 32, 16, 2
    g = h // p
    st = torch.ones(b * f, k, h, h)
    coef = torch.zeros(b * f, g, g, 2, ch, k)
    coef[:, :, 1, 1] = 0.5  # colour of the tokens of the right half, channel 0..k
    frame = torch.zeros(b, f, ch, h, h)
    out = lay_state(frame, coef, st, p)[0, 0, 0]  # (H, W)
    assert torch.allclose(out[:, :8], torch.zeros(h, 8)) and torch.allclose(out[:, -8:], torch.ones(h, 8))
    steps = out[0].diff()
    assert steps.max() <= 0.25 + 1e-6 and (steps >= 0).all()  # a ramp across the seam, not a step of 1.0
    assert len(torch.unique(out[0])) == 6  # 0, four blocks between the token centres, 1
    flat = torch.full_like(coef, 0.25)  # constant coefficients: the per-pixel formula, gain and colour 0.5 each
    assert torch.allclose(lay_state(frame, flat, st, p), (frame + 1) * 1.5 - 1 + 0.5)


def test_each_block_takes_the_bilinear_coefficients_at_its_centre() -> None:
    torch.manual_seed(0)
    b, f, ch, h, p, k = 2, 3, 3, 64, 16, 5
    g, n, q = h // p, b * f, h // BLOCK
    frame, coef, st = torch.randn(b, f, ch, h, h), torch.randn(n, g, g, 2, ch, k), torch.randn(n, k, h, h)
    at_centres = torch.nn.functional.interpolate(coef.reshape(n, g, g, -1).permute(0, 3, 1, 2), size=(q, q),
                                                 mode="bilinear", align_corners=False)
    per_pixel = at_centres.repeat_interleave(BLOCK, 2).repeat_interleave(BLOCK, 3).view(n, 2, ch, k, h, h)
    laid = torch.einsum("nkyx,nsckyx->nscyx", st, per_pixel).view(b, f, 2, ch, h, h)
    want = (frame + 1) * (1 + laid[:, :, 0]) - 1 + laid[:, :, 1]
    torch.testing.assert_close(lay_state(frame, coef, st, p), want, rtol=1e-5, atol=1e-5)


def test_the_learned_shapes_trace_for_any_number_of_covered_pixels() -> None:
    torch.manual_seed(0)
    basis = StateBasis(STATE_CHANNELS, features=4).eval()
    one = torch.from_numpy(_one_boat((32.0, 32.0), 0.0))[None]
    two = torch.from_numpy(_one_boat((10.0, 50.0), 1.0) + _one_boat((40.0, 20.0), 2.0))[None]
    traced = trace_body(basis, (one,))  # as the server records the default's chunks on the CPU
    with torch.no_grad():
        for st in (one, two, torch.zeros_like(one)):
            torch.testing.assert_close(traced(st), basis(st))
