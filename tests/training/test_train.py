"""A few training steps on a tiny config: the loss falls, checkpoints resume, weights export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan
from worldserve.training.train import TrainConfig, export_checkpoint, train

TINY = dict(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)


def _config(out: Path, steps: int, rollout_after: int) -> TrainConfig:
    return TrainConfig(
        out=str(out), minutes=10, max_steps=steps, batch=4, seq_frames=5, big_bucket_every=5,
        lr=3e-3, warmup=3, self_rollout_after=rollout_after, self_rollout_share=1.0, worlds=2,
        world_refresh=1000, map_size=256, checkpoint_minutes=60, model=TINY,
    )


def test_a_few_steps_lower_the_loss_then_resume_and_export(tmp_path: Path) -> None:
    report = train(_config(tmp_path, 30, rollout_after=1000), resume=False, export=None)
    assert report["steps"] == 30
    assert report["loss_last_10_this_run"] < 0.8 * report["loss_first_10_this_run"]

    # resume continues at the saved step, on self-rollout steps
    report2 = train(_config(tmp_path, 33, rollout_after=0), resume=True, export=tmp_path / "w")
    assert report2["steps"] == 33 and report2["steps_this_run"] == 3
    assert json.loads((tmp_path / "ckpt.json").read_text())["step"] == 33

    path = export_checkpoint(tmp_path, tmp_path / "again")
    runner = ModelRunner.from_pretrained(path)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 64, seed=0, scene="snowy night")]))
    a = np.zeros((1, ACTION_DIM), np.float32)
    out = runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork("s", 0, a)])]))
    assert not out.errors and out.results[0].frames.shape == (1, 64, 64, 3)


def test_a_fine_tune_starts_from_servable_weights_where_no_checkpoint_is_at_hand(tmp_path: Path) -> None:
    import dataclasses

    import torch
    from safetensors.torch import load_file

    from worldserve.model.default.net.config import ModelConfig
    from worldserve.model.default.net.dit import WorldModel
    from worldserve.model.default.weights import save_model
    from worldserve.training.checkpoint import init_from_weights

    cfg = dataclasses.replace(ModelConfig.from_dict(TINY), sampler_eta=0.0)  # a served setting the run keeps
    torch.manual_seed(3)
    served = save_model(WorldModel(cfg), tmp_path / "served", metadata={"steps": "120"})
    model, ema = WorldModel(cfg), WorldModel(cfg)
    assert init_from_weights(model, ema, served) == 120
    want = load_file(str(served))
    for m in (model, ema):
        assert all(torch.equal(v, want[k]) for k, v in m.state_dict().items())

    tc = dataclasses.replace(_config(tmp_path / "run", 123, rollout_after=1000), model={}, init_weights=str(served))
    report = train(tc, resume=True, export=tmp_path / "tuned")  # no checkpoint in --out: the weights start it
    assert report["steps"] == 123 and report["steps_this_run"] == 3
    assert json.loads((tmp_path / "tuned.json").read_text()) == json.loads(cfg.to_json())
    tuned = load_file(str(tmp_path / "tuned.safetensors"))
    assert any(not torch.equal(tuned[k], want[k]) for k in want)  # it trained
    with pytest.raises(FileNotFoundError):  # weights that are not there are an error, not a fresh model
        train(dataclasses.replace(tc, out=str(tmp_path / "other"), init_weights=str(tmp_path / "nowhere")),
              resume=False, export=None)


def test_shift_targets_put_the_weight_on_the_commanded_offset() -> None:
    from worldserve.session.plan import KEYS
    from worldserve.training.targets import shift_targets

    acts = np.zeros((1, 3, ACTION_DIM), np.float32)
    acts[0, 1, KEYS.index("right")] = 1.0  # the scene moves 2 px left: read prev 2 px right
    acts[0, 2, len(KEYS)] = 0.25  # mouse: half a pixel
    t = shift_targets(acts, 64, 5)
    assert t.shape == (1, 3, 2, 11) and np.allclose(t.sum(-1), 1.0)
    assert t[0, 0, 0, 5] == t[0, 0, 1, 5] == 1.0  # still
    assert t[0, 1, 1, 7] == 1.0 and t[0, 1, 0, 5] == 1.0
    assert np.allclose(t[0, 2, 1, 5:7], 0.5)


def test_motion_loss_prefers_the_commanded_kernel() -> None:
    import torch

    from worldserve.training.targets import motion_loss

    targets = torch.zeros(2, 3, 2, 11)
    targets[..., 7] = 1.0
    right = torch.full((6, 4, 4, 2, 11), 1e-3)
    right[..., 7] = 1.0 - 10e-3
    uniform = torch.full((6, 4, 4, 2, 11), 1 / 11)
    w = torch.ones(2, 3)
    assert motion_loss(right, targets, w) < 0.1 < motion_loss(uniform, targets, w)
    assert motion_loss(uniform, targets, torch.zeros(2, 3)) == 0.0


def test_the_motion_term_reaches_the_kernels() -> None:
    import torch

    from worldserve.model.default.net.config import ModelConfig
    from worldserve.model.default.net.dit import WorldModel
    from worldserve.training.data import WorldPool
    from worldserve.training.train import train_step

    cfg = ModelConfig(**TINY)
    model = WorldModel(cfg)
    batch = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256).sequences(2, 5, 64, far=False)
    g = torch.Generator().manual_seed(0)
    loss, stats = train_step(model, batch, cfg, g, use_rollout=False, motion_weight=0.1)
    assert "motion" in stats and float(stats["motion"]) > 0
    loss.backward()
    assert float(model.motion_prior["b64"].weight.grad.abs().sum()) > 0  # the prior learns the shift
    g = torch.Generator().manual_seed(0)
    plain, stats = train_step(model, batch, cfg, g, use_rollout=False)
    assert "motion" not in stats and float(plain.detach()) < float(loss.detach())


def test_the_motion_term_can_be_limited_to_some_weathers() -> None:
    import pytest
    import torch

    from worldserve.model.default.net.config import ModelConfig
    from worldserve.model.default.net.dit import WorldModel
    from worldserve.training.data import WorldPool
    from worldserve.training.targets import weather_mask
    from worldserve.training.train import train_step
    from worldserve.world import SceneAttrs

    scenes = np.stack([SceneAttrs(weather=w).to_vector() for w in ("clear", "snowfall", "rain", "fog")])[None]
    assert weather_mask(scenes, ("snowfall", "rain")).tolist() == [[0.0, 1.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="hail"):
        weather_mask(scenes, ("hail",))
    cfg = ModelConfig(**TINY)
    model = WorldModel(cfg)
    batch = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256).sequences(2, 5, 64, far=False)
    weather = SceneAttrs.from_vector(batch["scenes"][0, 0]).weather
    other = next(w for w in ("clear", "snowfall") if w != weather)
    batch["scenes"][:] = batch["scenes"][0, 0]  # one weather throughout
    losses = {}
    for name, weathers in (("all", ()), ("same", (weather,)), ("other", (other,))):
        g = torch.Generator().manual_seed(0)
        _, stats = train_step(model, batch, cfg, g, use_rollout=False, motion_weight=0.1, motion_weathers=weathers)
        losses[name] = float(stats["motion"])
    assert losses["all"] == pytest.approx(losses["same"]) and losses["all"] > 0
    assert losses["other"] == 0.0


def test_carry_targets_move_the_models_own_frame_over_static_ground_only() -> None:
    import torch

    from worldserve.training.targets import carry_targets

    g = torch.Generator().manual_seed(0)
    true_prev = torch.rand(1, 3, 3, 16, 16, generator=g) * 2 - 1
    own_prev = torch.rand(1, 3, 3, 16, 16, generator=g) * 2 - 1  # the model's drifted frames
    x = torch.roll(true_prev, (2, -1), (3, 4))  # the camera moved the ground by (2, -1)
    x[0, 0, :, 8:12, 8:12] = 0.9  # an actor walked in: not explained by the shift
    shifts = np.array([[[2.0, -1.0], [2.0, -1.0], [0.5, 0.0]]])
    shifts[0, 1] = np.nan  # no previous frame
    out, share = carry_targets(x, true_prev, own_prev, shifts)
    moved_own = torch.roll(own_prev[0, 0], (2, -1), (1, 2))
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[2:, :15] = True
    actor = torch.zeros(16, 16, dtype=torch.bool)
    actor[8:12, 8:12] = True
    carried = inside & ~actor
    assert torch.equal(out[0, 0][:, carried], moved_own[:, carried])
    assert torch.equal(out[0, 0][:, ~carried], x[0, 0][:, ~carried])  # new edge rows, the actor
    assert torch.equal(out[0, 1:], x[0, 1:])  # no previous frame; a fractional shift
    assert share == carried.sum().item() / (3 * 16 * 16)


def test_carry_shifts_keep_the_truth_after_an_unseen_frame_and_from_a_prompt_change_on() -> None:
    from worldserve.training.targets import carry_shifts
    from worldserve.world import SceneAttrs

    actions = np.zeros((2, 5, 6), np.float32)
    actions[:, :, 3] = 1.0  # right: the ground moves 2 px left at bucket 64
    scenes = np.repeat(SceneAttrs().to_vector()[None, None], 5, 1).repeat(2, 0)
    scenes[1, 3:] = SceneAttrs(weather="fog").to_vector()  # the second one's prompt changes at frame 3
    shifts = carry_shifts(actions, scenes, [0, 1, 2, 3, 4], 64)
    assert np.isnan(shifts[:, 0]).all()
    assert shifts[0, 1:].tolist() == [[0.0, -2.0]] * 4
    assert shifts[1, 1:3].tolist() == [[0.0, -2.0]] * 2 and np.isnan(shifts[1, 3:]).all()
    far = carry_shifts(actions[:1], scenes[:1], [0, 9, 10, 11, 12], 64)  # the sink lies far back
    assert np.isnan(far[0, :2]).all() and not np.isnan(far[0, 2:]).any()


def test_a_carry_step_trains_on_the_carried_targets() -> None:
    import torch

    from worldserve.model.default.net.config import ModelConfig
    from worldserve.model.default.net.dit import WorldModel
    from worldserve.training.data import WorldPool
    from worldserve.training.train import train_step

    cfg = ModelConfig(**TINY)
    model = WorldModel(cfg)
    batch = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256).sequences(2, 5, 64, far=False)
    g = torch.Generator().manual_seed(0)
    loss, stats = train_step(model, batch, cfg, g, use_rollout=True, carry=True)
    assert 0.0 < float(stats["carried"]) < 1.0 and torch.isfinite(loss)
    g = torch.Generator().manual_seed(0)
    plain, stats = train_step(model, batch, cfg, g, use_rollout=True)
    assert "carried" not in stats and float(plain.detach()) != float(loss.detach())


def test_a_canvas_step_takes_every_frames_reference_from_the_ground_through_the_tokenizer() -> None:
    import torch

    from worldserve.model.default.net.config import ModelConfig
    from worldserve.model.default.net.dit import WorldModel
    from worldserve.training.canvas_refs import CanvasReferences
    from worldserve.training.data import WorldPool
    from worldserve.training.train import train_step

    cfg = ModelConfig(**TINY)
    model = WorldModel(cfg)
    pool = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256)
    batch = pool.sequences(2, 4, 64, far=False, grounds=True)
    assert batch["grounds"].shape == batch["frames"].shape
    # the ground alone: no actors or weather on it, so it differs from the frame, but it is the same place
    assert not np.array_equal(batch["grounds"], batch["frames"])
    canvas = CanvasReferences.load(torch.device("cpu"))
    refs = canvas(batch["grounds"], batch["scenes"])
    assert refs.shape == (2, 4, 4, 64, 64)
    assert (refs[:, 0] == 0).all() and (refs[:, 1:, 3] == 1).all()  # the first frame has none
    truth = torch.from_numpy(batch["grounds"][:, 1:]).permute(0, 1, 4, 2, 3).float() / 127.5 - 1
    assert float(((refs[:, 1:, :3] - truth) ** 2).mean()) < 0.02  # the tokenizer's round trip
    seen: list[torch.Tensor] = []
    forward = model.forward_sequence

    def spy(x, prev, *args, **kw):  # type: ignore[no-untyped-def]
        seen.append(prev)
        return forward(x, prev, *args, **kw)

    model.forward_sequence = spy  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(0)
    loss, stats = train_step(model, batch, cfg, g, use_rollout=True, canvas=canvas)
    assert torch.isfinite(loss) and float(stats["canvas"]) == 1.0
    assert torch.equal(seen[-1][:, :4, cfg.channels :], refs)  # the clean context's references
    loss.backward()
    with pytest.raises(ValueError, match="tokenizer"):
        train_step(model, batch, cfg, g, use_rollout=False)


def test_a_rollout_lead_trains_on_the_frames_after_it_with_the_sink_kept() -> None:
    import torch

    from worldserve.model.default.net.config import ModelConfig
    from worldserve.model.default.net.dit import WorldModel
    from worldserve.training.data import WorldPool
    from worldserve.training.train import train_step

    cfg = ModelConfig(**TINY)
    model = WorldModel(cfg)
    batch = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256).sequences(2, 8, 64, far=False)
    seen: list[tuple[int, list[int]]] = []
    forward = model.forward_sequence

    def spy(x, prev, noise, actions, scene, pos, noisy, **kw):  # type: ignore[no-untyped-def]
        seen.append((x.shape[1], pos.tolist()))
        return forward(x, prev, noise, actions, scene, pos, noisy, **kw)

    model.forward_sequence = spy  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(0)
    loss, stats = train_step(model, batch, cfg, g, use_rollout=True, rollout_lead=3)
    assert torch.isfinite(loss) and "rollout_mse" in stats
    # sink 0, then frames 4..7 after the 3 generated ones: clean context + noisy queries
    assert seen == [(10, [0, 4, 5, 6, 7] * 2)]
    loss.backward()


def test_a_head_new_to_the_checkpoint_learns_at_its_own_rate() -> None:
    from worldserve.model.default.net.config import ModelConfig
    from worldserve.model.default.net.dit import WorldModel
    from worldserve.training.train import make_optimizer

    model = WorldModel(ModelConfig(**TINY))
    fresh = frozenset(n for n, _ in model.named_parameters() if n.startswith("anchor_heads."))
    opt = make_optimizer(model, TrainConfig(new_module_lr_scale=30.0), fresh)
    scale = {id(p): g["scale"] for g in opt.param_groups for p in g["params"]}
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert scale[id(p)] == (30.0 if name.startswith("anchor_heads.") else 1.0), name
        assert decay[id(p)] == (0.01 if p.dim() >= 2 else 0.0), name


def test_an_anchored_model_trains_on_its_own_rollouts_and_serves(tmp_path: Path) -> None:
    from worldserve.session.plan import SessionUpdate

    cfg = _config(tmp_path, 6, rollout_after=0)
    cfg.model = TINY
    cfg.rollout_lead, cfg.carry_share, cfg.self_rollout_share = 1, 0.5, 0.5
    report = train(cfg, resume=False, export=tmp_path / "w")
    assert report["steps"] == 6 and np.isfinite(report["loss_last_10_this_run"])
    runner = ModelRunner.from_pretrained(tmp_path / "w.safetensors")
    from worldserve.world import expected_shift

    acts = np.random.default_rng(0).uniform(0, 1, (20, ACTION_DIM)).astype(np.float32)
    acts[:, 4:] = acts[:, 4:] * 2 - 1
    import torch

    with torch.no_grad():
        got = runner.model.camera_shift(torch.from_numpy(acts), 128).numpy()
    want = np.array([expected_shift(a, 128) for a in acts])
    assert np.abs(got - want).max() < 1e-3  # solved, not left to a few Adam steps
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 64, seed=0, scene="snowy night")]))
    a = np.zeros((1, ACTION_DIM), np.float32)
    a[0, 3] = 1.0
    for i in range(3):
        out = runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork("s", i, a)])]))
        assert not out.errors and out.results[0].frames.shape == (1, 64, 64, 3)
    runner.execute(StepPlan(updates=[SessionUpdate("s", scene="desert day")]))
    out = runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork("s", 3, a)])]))
    assert not out.errors


def test_every_config_field_has_its_flag(monkeypatch) -> None:
    import worldserve.training.train as mt

    got: list = []
    monkeypatch.setattr(mt, "train", lambda tc, resume, export: got.append((tc, resume, export)))
    mt.main(["--out", "r", "--bank-share", "0.3", "--adv-weight", "0.02", "--motion-weathers", "snowfall,rain",
             "--model", '{"depth": 3}', "--restart-schedule", "--resume", "--far-sink-share", "0.25",
             "--train-only", "refiner.,heads.", "--texture-weight", "0.005"])
    tc, resume, export = got[0]
    assert (tc.out, tc.bank_share, tc.adv_weight, tc.far_sink_share) == ("r", 0.3, 0.02, 0.25)
    assert tc.motion_weathers == ("snowfall", "rain") and tc.model == {"depth": 3}
    assert tc.train_only == ("refiner.", "heads.") and tc.texture_weight == 0.005
    assert tc.restart_schedule and resume and export is None
    mt.main([])
    assert got[1][0] == TrainConfig()  # no flags: the config's own defaults
