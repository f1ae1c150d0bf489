"""The ground tokenizer and its training stage: a code per 4x4 pixels, small half-precision
weights that load to the same codes, and a stage that resumes where it stopped or from the
committed export."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from worldserve.model.default.reference.canvas.tokenizer import (
    GroundTokenizer,
    LocalGroupNorm,
    TokenizerConfig,
    load_tokenizer,
    save_tokenizer,
)
from worldserve.training.data import TRAIN_SEED_BASE
from worldserve.training.tokenizer import PairedWorld, TokenizerTrainConfig, relit, train
from worldserve.world import sample_scene

TINY = TokenizerConfig(codes=16, code_dim=4, widths=(8, 8, 8), groups=4)


def test_a_code_covers_4x4_pixels_and_decodes_back_to_a_frame() -> None:
    model = GroundTokenizer(TINY).eval()
    frames = torch.rand(2, 3, 64, 64) * 2 - 1
    ids = model.encode(frames)
    assert ids.shape == (2, 16, 16) and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < TINY.codes
    assert model.decode(ids, torch.zeros(2, TINY.scene_dim)).shape == (2, 3, 64, 64)


def test_the_shipped_weights_are_half_precision_small_and_load_to_the_same_codes(tmp_path: Path) -> None:
    model = GroundTokenizer()  # the shipped size
    path = save_tokenizer(model, tmp_path / "tokenizer", {"steps": 3})
    assert all(t.dtype == torch.float16 for t in load_file(str(path)).values())
    assert path.stat().st_size < 2_000_000
    back = load_tokenizer(tmp_path / "tokenizer")
    model.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    frames = torch.rand(2, 3, 32, 32) * 2 - 1
    assert torch.equal(back.encode(frames), model.eval().encode(frames))


def test_a_local_norm_whose_window_covers_the_input_is_the_group_norm() -> None:
    local, plain = LocalGroupNorm(4, 8, window=33), torch.nn.GroupNorm(4, 8)
    with torch.no_grad():
        for p in (local.weight, local.bias):
            p.normal_()
    plain.load_state_dict(local.state_dict())  # the same parameters: the weights load either way
    x = torch.randn(2, 8, 16, 16) * 3 + 1
    assert torch.allclose(local(x), plain(x), atol=1e-4)
    assert not torch.allclose(LocalGroupNorm(4, 8, window=5)(x), torch.nn.GroupNorm(4, 8)(x), atol=1e-2)


@pytest.mark.parametrize("window", [0, 8])
def test_with_a_norm_window_a_pixel_decodes_the_same_whatever_lies_far_from_it(window: int) -> None:
    torch.manual_seed(0)
    model = GroundTokenizer(replace(TINY, norm_window=window)).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, TINY.codes, (1, 40, 40), generator=gen)
    far = ids.clone()
    far[:, :8, :8] = torch.randint(0, TINY.codes, (1, 8, 8), generator=gen)  # other ground in one corner
    scene = torch.randn(1, TINY.scene_dim, generator=gen)
    with torch.no_grad():
        a, b = model.decode(ids, scene)[..., -32:, -32:], model.decode(far, scene)[..., -32:, -32:]
    # 96 px away or more: with whole-input statistics the far corner's codes move every pixel
    # (by hundredths); with a window, only the rounding of the summed-area table's sums
    assert ((a - b).abs().max() < 1e-4) == bool(window)


def test_a_re_skin_keeps_biome_vegetation_and_weather() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = sample_scene(rng)
        b = relit(a, rng)
        assert (a.biome, a.vegetation, a.weather) == (b.biome, b.vegetation, b.weather)


def test_the_stage_resumes_where_it_stopped_and_else_from_the_committed_export(tmp_path: Path) -> None:
    tc = TokenizerTrainConfig(out=tmp_path / "run", minutes=10, steps=2, batch=4, crop=16, worlds=2, map_size=256,
                              eval_every=1000, model=TINY)
    first = train(tc, resume=False, export=tmp_path / "w" / "tokenizer")
    assert first["steps"] == 2 and (tmp_path / "run" / "ckpt.safetensors").exists()
    again = train(tc, resume=True, export=None)
    assert again["steps"] == 4
    assert json.loads((tmp_path / "run" / "ckpt.json").read_text())["step"] == 4
    # a new session without the run's checkpoint starts from the export's weights and step count
    other = TokenizerTrainConfig(**{**tc.__dict__, "out": tmp_path / "elsewhere"})
    assert train(other, resume=True, export=None, init=tmp_path / "w" / "tokenizer")["steps"] == 4


def test_the_sharpening_stage_moves_the_decoder_alone_and_resumes_its_critic(tmp_path: Path) -> None:
    """``--decoder-only --adv-weight``: the codes (and the bank built on them) stay valid, and
    the critic comes back with the checkpoint."""
    base = TokenizerTrainConfig(out=tmp_path / "base", minutes=10, steps=2, batch=4, crop=16, worlds=2,
                                map_size=256, eval_every=1000, model=TINY)
    train(base, resume=False, export=tmp_path / "w" / "tokenizer")
    before = load_tokenizer(tmp_path / "w" / "tokenizer")
    tc = TokenizerTrainConfig(**{**base.__dict__, "out": tmp_path / "sharp", "decoder_only": True,
                                 "adv_weight": 0.5, "adv_warmup": 1, "lr_end": 1e-5, "steps": 4})
    report = train(tc, resume=True, export=tmp_path / "s" / "tokenizer", init=tmp_path / "w" / "tokenizer")
    assert {"psnr", "psnr_reskin", "sharpness"} <= report["held_out"].keys()
    after = load_tokenizer(tmp_path / "s" / "tokenizer")
    old, new = before.state_dict(), after.state_dict()
    assert all(torch.equal(old[k], new[k]) for k in old if not k.startswith("decoder."))
    assert any(not torch.equal(old[k], new[k]) for k in old if k.startswith("decoder."))
    tensors = load_file(str(tmp_path / "sharp" / "ckpt.safetensors"))
    assert any(k.startswith("critic.") for k in tensors) and any(k.startswith("copt.") for k in tensors)
    assert train(tc, resume=True, export=None)["steps"] == report["steps"] + 4


def test_the_decoder_holds_still_while_a_fresh_critic_learns_the_views_alone(tmp_path: Path) -> None:
    """``--adv-warmup``: a sharpened decoder stepped on squared error alone while a new critic
    warms up would drift back toward blur, so for those steps only the critic (of the width
    asked) moves."""
    base = TokenizerTrainConfig(out=tmp_path / "base", minutes=10, steps=1, batch=4, crop=16, worlds=2,
                                map_size=256, eval_every=1000, model=TINY)
    train(base, resume=False, export=tmp_path / "w" / "tokenizer")
    tc = TokenizerTrainConfig(**{**base.__dict__, "out": tmp_path / "warm", "decoder_only": True,
                                 "adv_weight": 0.5, "adv_warmup": 10, "critic_width": 8, "steps": 3})
    train(tc, resume=True, export=tmp_path / "s" / "tokenizer", init=tmp_path / "w" / "tokenizer")
    before, after = load_tokenizer(tmp_path / "w" / "tokenizer"), load_tokenizer(tmp_path / "s" / "tokenizer")
    assert all(torch.equal(v, after.state_dict()[k]) for k, v in before.state_dict().items())
    tensors = load_file(str(tmp_path / "warm" / "ckpt.safetensors"))
    assert tensors["critic.convs.0.parametrizations.weight.original"].shape[0] == 8
    assert any(k.startswith("copt.") for k in tensors)


def test_a_switch_to_bilinear_upsampling_keeps_the_codes_and_travels_with_the_weights(tmp_path: Path) -> None:
    """``--upsample bilinear`` from an export trained with nearest upsampling: the same weights
    (so the same codes, and the bank stays valid), a decoder that draws no 4-px grid, and the
    choice kept by the checkpoint and the export."""
    base = TokenizerTrainConfig(out=tmp_path / "base", minutes=10, steps=1, batch=4, crop=16, worlds=2,
                                map_size=256, eval_every=1000, model=TINY)
    train(base, resume=False, export=tmp_path / "w" / "tokenizer")
    before = load_tokenizer(tmp_path / "w" / "tokenizer")
    assert before.cfg.upsample == "nearest"
    tc = TokenizerTrainConfig(**{**base.__dict__, "out": tmp_path / "smooth", "decoder_only": True, "steps": 2})
    train(tc, resume=True, export=tmp_path / "s" / "tokenizer", init=tmp_path / "w" / "tokenizer", upsample="bilinear")
    after = load_tokenizer(tmp_path / "s" / "tokenizer")
    assert after.cfg.upsample == "bilinear"
    frames = torch.rand(2, 3, 32, 32) * 2 - 1
    assert torch.equal(after.encode(frames), before.encode(frames))
    assert train(tc, resume=True, export=None)["steps"] == 5  # resumed, still bilinear
    assert json.loads((tmp_path / "smooth" / "ckpt.json").read_text())["model"]["upsample"] == "bilinear"


def test_a_norm_window_must_fall_on_the_code_grid() -> None:
    with pytest.raises(ValueError, match="norm_window"):
        TokenizerConfig(norm_window=6)


def test_bilinear_upsampling_changes_the_decode_not_its_shape() -> None:
    nearest = GroundTokenizer(TINY).eval()
    smooth = GroundTokenizer(replace(TINY, upsample="bilinear")).eval()
    smooth.load_state_dict(nearest.state_dict())
    ids = torch.randint(0, TINY.codes, (1, 8, 8))
    scene = torch.zeros(1, TINY.scene_dim)
    a, b = nearest.decode(ids, scene), smooth.decode(ids, scene)
    assert a.shape == b.shape == (1, 3, 32, 32) and not torch.allclose(a, b)
    with pytest.raises(ValueError, match="upsample"):
        TokenizerConfig(upsample="cubic")


def test_reused_views_are_the_world_s_under_its_current_scenes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--reuse``: a world renders a share of its views a step and draws the rest from those it
    rendered under the same pair of scenes; a scene change forgets them."""
    rng = np.random.default_rng(3)
    world = PairedWorld(TRAIN_SEED_BASE + 5, rng, 256)
    rendered: list[int] = []
    views = PairedWorld.views
    monkeypatch.setattr(PairedWorld, "views", lambda self, n, r: (rendered.append(n), views(self, n, r))[1])
    first = world.recent_views(8, 4, rng)
    second = world.recent_views(8, 4, rng)
    assert rendered == [8, 2] and first[0].shape == second[0].shape == (8, 64, 64, 3)
    kept_a = {a.tobytes() for a, _ in world.kept}
    assert all(a.tobytes() in kept_a for a in second[0]) and len(world.kept) == 10
    world.rescene(rng, 0.5)
    assert world.kept == []
    world.recent_views(8, 4, rng)
    assert rendered == [8, 2, 8]
