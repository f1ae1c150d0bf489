"""The pixel refiner (``refine_channels``): added to trained weights it changes nothing until
it trains; it keeps the cached path equal to the full sequence; it sees the noisy frame and
reaches across token borders; training it alone leaves the rest of the model as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model.consistency import cached_vs_full
from model.dit import WorldModel
from model.refine import PixelRefiner
from model.weights import WeightsError, load_model, load_state, save_model
from tests.model.conftest import randomized, tiny_config
from tests.model.test_motion_layers import _inputs


def test_refine_channels_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="refine_channels must be >= 0"):
        tiny_config(refine_channels=-1)


def test_a_model_without_the_refiner_loads_into_one_and_gives_the_same_frames() -> None:
    old = randomized(tiny_config())
    new = WorldModel(tiny_config(refine_channels=8)).eval()
    load_state(new, old.state_dict(), "weights without a refiner", allow_missing=("refiner.",))
    with torch.no_grad():
        a, _ = old.forward_sequence(*_inputs(old.cfg))
        b, _ = new.forward_sequence(*_inputs(new.cfg))
    assert torch.equal(a, b)


def test_cached_generation_equals_full_sequence_with_a_refiner() -> None:
    cfg = tiny_config(anchor_warp=True, refine_channels=8)
    assert cached_vs_full(randomized(cfg), n_chunks=6, bucket=32) <= 1e-4


def test_the_refiner_reads_the_noisy_frame_across_token_borders() -> None:
    torch.manual_seed(0)
    ref = PixelRefiner(3, 8)
    with torch.no_grad():
        ref.out.weight.normal_(0, 0.2)
    guess = torch.zeros(1, 3, 32, 32)
    noisy = torch.zeros(1, 3, 32, 32, requires_grad=True)
    out = ref(guess, noisy, 0.25)
    out[0, :, 10, 15].sum().backward()  # the last column of the first 16-pixel token
    grad = noisy.grad[0].abs().sum(0)
    assert grad[10, 16:20].gt(0).all()  # pixels of the next token reach it
    assert grad[:, 20:].eq(0).all() and grad[:, :11].eq(0).all()  # a 9-pixel field, no further
    # the noise level is an input: the same frames at another level give another output
    assert not torch.allclose(ref(guess, noisy.detach(), 0.25), ref(guess, noisy.detach(), 0.75))


def test_per_frame_levels_equal_one_level_for_all() -> None:
    torch.manual_seed(1)
    ref = PixelRefiner(3, 8)
    with torch.no_grad():
        ref.out.weight.normal_(0, 0.2)
    guess, noisy = torch.rand(4, 3, 16, 16), torch.rand(4, 3, 16, 16)
    assert torch.allclose(ref(guess, noisy, 0.5), ref(guess, noisy, torch.full((4,), 0.5)))


def test_refiner_weights_round_trip_and_missing_ones_are_named(tmp_path: Path) -> None:
    model = randomized(tiny_config(refine_channels=8))
    path = save_model(model, tmp_path / "w")
    back = load_model(path)
    assert back.cfg.refine_channels == 8
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    state = {k: v for k, v in model.state_dict().items() if k != "refiner.mid.weight"}
    with pytest.raises(WeightsError, match=r"missing key .refiner\.mid\.weight"):
        load_state(WorldModel(model.cfg), state, "weights")


def test_training_only_the_refiner_leaves_the_rest_as_it_was(tmp_path: Path) -> None:
    from model.train import train
    from tests.model.test_train import TINY, _config

    base = _config(tmp_path, 6, rollout_after=0)
    base.self_rollout_share = 0.5
    train(base, resume=False, export=tmp_path / "before")
    base.model = {**TINY, "refine_channels": 8}
    base.max_steps, base.train_only, base.new_module_lr_scale = 16, ("refiner.",), 3.0
    report = train(base, resume=True, export=tmp_path / "after")
    assert report["steps_this_run"] == 10 and np.isfinite(report["loss_last_10_this_run"])
    before, after = load_model(tmp_path / "before.safetensors"), load_model(tmp_path / "after.safetensors")
    old = before.state_dict()
    for name, v in after.state_dict().items():
        if name.startswith("refiner."):
            continue
        assert torch.equal(v, old[name]), name
    assert after.refiner.out.weight.abs().sum() > 0  # it trained (it starts at zero)


def test_train_only_must_name_some_parameter(tmp_path: Path) -> None:
    from model.train import TrainConfig, train
    from tests.model.test_train import TINY

    tc = TrainConfig(out=str(tmp_path), max_steps=1, batch=2, seq_frames=5, worlds=1, map_size=256,
                     model=TINY, train_only=("nothing.",))
    with pytest.raises(ValueError, match="names no parameter"):
        train(tc, resume=False, export=None)
