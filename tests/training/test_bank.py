"""The rollout bank (``training/bank.py``): long-running sessions of the serving path,
beside their worlds, as training batches; a bank step's frame loss counts only where the
camera alone explains the renderer's frame."""

from __future__ import annotations

import numpy as np
import torch

from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.training.bank import RolloutBank
from worldserve.training.targets import carry_mask, moved_frames
from worldserve.training.train import train_step

TINY = ModelConfig(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)


def _bank(life: int = 12, seq: int = 5, slots: int = 2) -> RolloutBank:
    torch.manual_seed(0)
    return RolloutBank(WorldModel(TINY), slots, 64, seq, life, np.random.default_rng(0), map_size=256)


def test_a_bank_batch_is_the_sessions_newest_frames_after_their_sink() -> None:
    bank = _bank()
    b = bank.batch()
    assert b["frames"].shape == b["truth"].shape == (2, 5, 64, 64, 3) and bool(b["far"])
    assert b["actions"].shape == (2, 5, 6) and b["scenes"].shape[:2] == (2, 5)
    for i, s in enumerate(bank.slots):
        assert np.array_equal(b["frames"][i, 0], s.sink) and np.array_equal(b["truth"][i, 0], s.sink)
        assert np.array_equal(b["frames"][i, -1], s.own[-1])  # the runner's newest frame
        assert np.array_equal(b["truth"][i, -1], s.world.render(64))  # the world, moved alongside
    assert np.array_equal(b["prevs"][:, 2:], b["frames"][:, 1:-1])  # each frame's own previous frame
    assert np.array_equal(b["truth_prevs"][:, 2:], b["truth"][:, 1:-1])
    assert not b["prevs"][:, 0].any()  # the sink starts the epoch


def test_bank_sessions_live_on_across_batches_then_start_over() -> None:
    bank = _bank(life=12)
    for _ in range(30):
        before = [(s.age, len(s.actions)) for s in bank.slots]
        bank.advance(1)
        assert bank.ages() == [a + 1 if a + 1 < life else 1 for a, life in before]
    assert len(bank.runner.sessions) == 2  # the ended sessions were freed
    assert min(s.world.seed for s in bank.slots) > 900_000  # not the bench's worlds, nor training's pool


def test_a_bank_step_carries_the_ground_where_the_renderer_only_moved() -> None:
    from tests.model.conftest import randomized
    from worldserve.training.targets import carry_shifts
    from worldserve.training.train import positions

    bank = _bank()
    batch = bank.batch()
    model = randomized(TINY).train()

    loss, stats = train_step(model, batch, TINY, torch.Generator().manual_seed(0), use_rollout=False,
                             edge_weight=0.2)
    assert torch.isfinite(loss) and "edge" not in stats  # no edges to match in the model's own frames

    enc = WorldModel.encode
    truth, truth_prev = enc(torch.from_numpy(batch["truth"])), enc(torch.from_numpy(batch["truth_prevs"]))
    shifts = carry_shifts(batch["actions"], batch["scenes"], positions(5, True, TINY), 64)
    static = carry_mask(truth, truth_prev, shifts).numpy()
    assert not static[:, :2].any() and static[:, 2:].any()  # not the sink nor the frame after the gap
    assert float(stats["bank_carried"]) == float(torch.from_numpy(static[:, 1:]).float().mean())


def test_the_masked_frame_loss_counts_only_the_weighted_pixels() -> None:
    from worldserve.training.targets import masked_mse

    g = torch.Generator().manual_seed(0)
    pred, target = torch.rand(2, 3, 3, 8, 8, generator=g), torch.rand(2, 3, 3, 8, 8, generator=g)
    weight = torch.zeros(2, 3, 1, 8, 8)
    weight[0, 1, :, 2:5] = 1.0
    sel = weight.expand_as(pred).bool()
    assert torch.allclose(masked_mse(pred, target, weight), ((pred - target)[sel] ** 2).mean())
    other = target.clone()
    other[~sel] += 5.0  # nothing outside the weight counts
    assert torch.equal(masked_mse(pred, other, weight), masked_mse(pred, target, weight))
    assert masked_mse(pred, target, torch.zeros_like(weight)) == 0.0


def test_moved_frames_follow_whole_shifts_and_leave_the_rest() -> None:
    frames = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(1, 2, 3, 8, 8)
    shifts = np.array([[[1.0, -2.0], [0.5, 0.0]]])
    out = moved_frames(frames, shifts)
    assert torch.equal(out[0, 0], torch.roll(frames[0, 0], (1, -2), (1, 2)))
    assert torch.equal(out[0, 1], frames[0, 1])  # a fractional shift is not carried
    mask = carry_mask(torch.roll(frames, (1, -2), (3, 4)), frames, shifts)
    assert mask[0, 0, 1:, :6].all() and not mask[0, 0, 0].any() and not mask[0, 1].any()
