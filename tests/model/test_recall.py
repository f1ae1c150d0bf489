"""Recall (``recall_patch``): the pixels the camera brings into view are copied from a drawn
window of the sink frame, nowhere else; the window that continues the view scores highest
before any training; labels name the nearest window; serving draws from each session's own
noise and stops drawing from a sink whose scene is gone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model.recall import STRIDE, Recall, draw, new_pixels, recall_loss, uniforms
from model.runner import ModelRunner
from session.plan import ACTION_DIM, KEYS, Batch, ChunkWork, SessionSpec, SessionUpdate, StepPlan
from tests.model.conftest import make_runner, tiny_config


def _recall(sub: int = 8) -> Recall:
    torch.manual_seed(0)
    rc = Recall(width=16, channels=3, patch=16, sub=sub)
    rc.reset_parameters()
    return rc


def test_recall_needs_the_anchor_and_a_divisor_of_the_patch() -> None:
    with pytest.raises(ValueError, match="needs anchor_warp"):
        tiny_config(recall_patch=8)
    with pytest.raises(ValueError, match=r"must be 0 \(off\) or divide patch"):
        tiny_config(anchor_warp=True, recall_patch=6)
    assert tiny_config(anchor_warp=True, recall_patch=8).noise_draws(2) == 3  # one draw for the choices


def test_new_pixels_are_those_whose_source_lies_outside_the_previous_frame() -> None:
    new = new_pixels(torch.tensor([[0.0, 0.0], [0.0, 2.0], [-1.6, 0.0], [3.0, -2.0], [1e-3, -0.4]]), 8)[:, 0]
    assert not new[0].any() and not new[4].any()  # at rest, or a hair off it: nothing new
    assert new[1, :, :2].all() and not new[1, :, 2:].any()  # scene moves right: new at the left
    assert new[2, 6:].all() and not new[2, :6].any()  # 1.6 px up: two rows, one of them mostly
    want = torch.zeros(8, 8, dtype=torch.bool)
    want[:3], want[:, 6:] = True, True
    assert torch.equal(new[3], want)


def test_paste_copies_the_chosen_windows_into_the_new_pixels_only() -> None:
    rc = _recall()
    sink = torch.rand(1, 3, 32, 32) * 2 - 1
    guess = torch.rand(1, 3, 32, 32) * 2 - 1
    new = new_pixels(torch.tensor([[0.0, 3.0]]), 32)
    cand = rc.candidates(sink)
    per_side = (32 - 8) // STRIDE + 1
    assert cand.shape == (1, per_side**2, 3 * 64)
    idx = torch.full((1, 16), 5 * per_side + 7)  # every sub-patch picks the window at (10, 14)
    out = rc.paste(guess, new, cand, idx)
    assert torch.equal(out[:, :, :, 3:], guess[:, :, :, 3:])
    window = sink[0, :, 10:18, 14:22]
    for row in range(4):
        assert torch.equal(out[0, :, row * 8 : row * 8 + 8, :3], window[:, :, :3])


def test_labels_name_the_window_a_sub_patch_was_cut_from() -> None:
    rc = _recall()
    sink = torch.rand(2, 3, 32, 32) * 2 - 1
    target = torch.rand(2, 3, 32, 32) * 2 - 1
    target[1, :, 8:16, 0:8] = sink[1, :, 4:12, 20:28]  # sub-patch (1, 0) is window (2, 10) in grid units
    labels = rc.labels(target, rc.candidates(sink))
    assert int(labels[1, 4]) == 2 * ((32 - 8) // STRIDE + 1) + 10


def test_before_training_the_window_that_continues_the_view_scores_highest() -> None:
    rc = _recall()
    sink = torch.rand(1, 3, 32, 32) * 2 - 1
    truth = sink[:, :, 6:22, 4:20].repeat(1, 1, 2, 2)  # every 16-px block one part of the sink
    new = new_pixels(torch.tensor([[0.0, 2.0]]), 32)  # the two left columns are new
    guess = torch.where(new, torch.zeros_like(truth), truth)
    cand = rc.candidates(sink)
    logits = rc.logits(torch.zeros(1, 4, 16), guess, new, cand)
    best = logits.argmax(-1)[0]
    per_side = (32 - 8) // STRIDE + 1
    # sub-patch (0, 0) holds sink rows 6..13, columns 4..11: the window at (6, 4)
    assert int(best[0]) == 3 * per_side + 2
    pasted = rc.paste(guess, new, cand, best[None])
    assert torch.equal(pasted[0, :, :8, :2], truth[0, :, :8, :2])


def test_draws_follow_the_softmax_and_the_uniforms() -> None:
    logits = torch.log(torch.tensor([[[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]]]))
    u = torch.tensor([[0.05, 0.99]])
    assert draw(logits, u).tolist() == [[0, 1]]
    assert draw(logits, torch.tensor([[0.29, 0.5]])).tolist() == [[1, 0]]
    z = torch.randn(2, 3, 32, 32)
    uu = uniforms(z, 8)
    assert uu.shape == (2, 16) and bool(((uu > 0) & (uu < 1)).all())


def test_the_loss_counts_only_weighted_sub_patches() -> None:
    logits = torch.zeros(1, 2, 4)
    logits[0, 0, 1] = 10.0
    labels = torch.tensor([[1, 3]])
    only_first = recall_loss(logits, labels, torch.tensor([[1.0, 0.0]]))
    assert float(only_first) < 0.01
    assert float(recall_loss(logits, labels, torch.tensor([[1.0, 1.0]]))) > 0.5
    assert float(recall_loss(logits, labels, torch.zeros(1, 2))) == 0.0


def _recall_runner(seed: int = 0) -> ModelRunner:
    runner = make_runner(tiny_config(anchor_warp=True, recall_patch=8), seed=seed)
    with torch.no_grad():  # a shift head that moves the scene 2 px left per "right" key
        runner.model.shift_head.weight.zero_()
        runner.model.shift_head.bias.zero_()
        runner.model.shift_head.weight[1, KEYS.index("right")] = -2.0
    return runner


def _right() -> np.ndarray:
    a = np.zeros((1, ACTION_DIM), np.float32)
    a[0, KEYS.index("right")] = 1.0
    return a


def _run(runner: ModelRunner, ids: list[str], chunks: int, first: int = 0) -> dict[str, list[np.ndarray]]:
    out: dict[str, list[np.ndarray]] = {s: [] for s in ids}
    for c in range(first, first + chunks):
        res = runner.execute(StepPlan(batches=[Batch(32, 2, [ChunkWork(s, c, _right()) for s in ids])]))
        assert not res.errors
        for r in res.results:
            out[r.session_id].append(r.frames[-1])
    return out


def _windows(sink: np.ndarray) -> set[bytes]:
    """Every 8 x 2 column strip of the sink's windows (the new pixels of a sub-patch when the
    view moves 2 px)."""
    return {sink[y : y + 8, x + 6 : x + 8].tobytes() for y in range(0, 25, STRIDE) for x in range(0, 25, STRIDE)}


def test_serving_fills_the_new_columns_from_the_sinks_windows() -> None:
    runner = _recall_runner()
    obs = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", observation=obs)]))
    frames = _run(runner, ["s"], 4)["s"]
    strips = _windows(obs)
    for fr in frames:  # the camera moves right: the two right-most columns are new
        for row in range(4):
            assert fr[row * 8 : row * 8 + 8, 30:].tobytes() in strips


def test_a_prompt_change_stops_recall_until_the_sinks_scene_returns() -> None:
    runner = _recall_runner()
    obs = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", observation=obs)]))
    s = runner.sessions["s"]
    sources = runner._recall_sources([s], 32)
    assert sources is not None and bool(sources[1][0])
    runner.execute(StepPlan(updates=[SessionUpdate("s", scene="y")]))
    sources = runner._recall_sources([s], 32)
    assert sources is not None and not bool(sources[1][0])
    frames = _run(runner, ["s"], 3)["s"]
    strips = _windows(obs)
    assert any(fr[row * 8 : row * 8 + 8, 30:].tobytes() not in strips for fr in frames for row in range(4))
    runner.execute(StepPlan(updates=[SessionUpdate("s", scene="x")]))
    sources = runner._recall_sources([s], 32)
    assert sources is not None and bool(sources[1][0])


def test_a_batch_of_recalling_sessions_gives_each_what_it_gets_alone() -> None:
    rng = np.random.default_rng(2)
    obs = {s: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for s in ("a", "b")}

    def run(ids: list[str]) -> dict[str, list[np.ndarray]]:
        runner = _recall_runner()
        runner.execute(StepPlan(new_sessions=[
            SessionSpec(s, 32, seed=k, scene="x", observation=obs[s]) for k, s in enumerate(ids)]))
        return _run(runner, ids, 5)

    together = run(["a", "b"])
    alone = run(["a"])
    diffs = [np.abs(x.astype(int) - y.astype(int)) for x, y in zip(together["a"], alone["a"], strict=True)]
    assert diffs[0].max() <= 1 and max(d.mean() for d in diffs) < 1.0


def test_the_recall_term_learns_on_a_batch_and_reaches_only_recall() -> None:
    from model.config import ModelConfig
    from model.dit import WorldModel
    from model.train import train_step
    from model.train_data import WorldPool
    from tests.model.test_train import TINY

    cfg = ModelConfig(**TINY, anchor_warp=True, recall_patch=8)  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = WorldModel(cfg)
    batch = WorldPool(1, cfg.buckets, np.random.default_rng(0), map_size=256).sequences(2, 5, 64, far=False)
    batch["actions"][:] = 0.0
    batch["actions"][..., KEYS.index("right")] = 1.0  # new ground at the right edge of every frame
    for p in model.parameters():
        p.requires_grad_(False)
    params = list(model.recall.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=3e-3)
    seen = []
    for _ in range(30):
        loss, stats = train_step(model, batch, cfg, torch.Generator().manual_seed(0), use_rollout=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append(float(stats["recall"]))
    assert seen[-1] < 0.8 * seen[0]
    _, off = train_step(model, batch, cfg, torch.Generator().manual_seed(0), use_rollout=False, recall_weight=0.0)
    assert "recall" not in off


def test_training_only_recall_leaves_the_rest_as_it_was(tmp_path: Path) -> None:
    from model.train import train
    from model.weights import load_model
    from tests.model.test_train import TINY, _config

    base = _config(tmp_path, 4, rollout_after=0)
    base.model = {**TINY, "anchor_warp": True}
    base.self_rollout_share = 0.0
    train(base, resume=False, export=tmp_path / "before")
    base.model = {**TINY, "anchor_warp": True, "recall_patch": 8}
    base.max_steps, base.train_only = 8, ("recall.",)
    report = train(base, resume=True, export=tmp_path / "after")
    assert report["steps_this_run"] == 4 and np.isfinite(report["loss_last_10_this_run"])
    before, after = load_model(tmp_path / "before.safetensors"), load_model(tmp_path / "after.safetensors")
    old = before.state_dict()
    for name, v in after.state_dict().items():
        if not name.startswith("recall."):
            assert torch.equal(v, old[name]), name
    assert after.recall.match_scale.item() != pytest.approx(4.0, abs=1e-6)  # it trained
