"""The oracle reference of ``bench.quality --oracle``: the committed weights' shift sum is the
commanded shift, and an oracle session keeps the renderer's view as its anchor, moved by that
shift, until the bench refreshes it, however far or long the camera goes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model.conftest import randomized, scene_encoder_for, tiny_config
from worldserve.bench._oracle import Oracle, OracleRunner
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.reference.anchor import REANCHOR_FRAMES, clamped_actions
from worldserve.model.default.weights import DEFAULT_WEIGHTS, load_model
from worldserve.session.plan import ACTION_DIM, KEYS, Batch, ChunkWork, SessionSpec, StepPlan
from worldserve.world import World, expected_shift, mixed_policy


def test_the_shift_head_sums_the_commanded_shift() -> None:
    model = load_model(DEFAULT_WEIGHTS)
    acts = mixed_policy(300, np.random.default_rng(0)).astype(np.float32)
    acts[::7, KEYS.index("forward")] = 1.0  # keys held together with the mouse too
    want = np.array([expected_shift(a, 64) for a in acts])
    with torch.no_grad():
        got = model.camera_shift(clamped_actions(model.cfg, torch.from_numpy(acts)), 64).numpy()
    assert np.abs(got - want).max() < 1e-3


def _oracle_runner() -> OracleRunner:
    cfg = tiny_config()
    runner = OracleRunner(randomized(cfg), scene_encoder=scene_encoder_for(cfg))
    with torch.no_grad():  # the scene moves 1 px left per frame at 32 px under "right"
        runner.model.shift_head.weight.zero_()
        runner.model.shift_head.bias.zero_()
        runner.model.shift_head.weight[1, KEYS.index("right")] = -1.0
    return runner


def _right(runner: OracleRunner, block: int) -> None:
    a = np.zeros((1, ACTION_DIM), np.float32)
    a[0, KEYS.index("right")] = 1.0
    out = runner.execute(StepPlan(batches=[Batch(32, 2, [ChunkWork("s", block, a)])]))
    assert not out.errors, out.errors


def test_an_oracle_session_keeps_the_given_view_however_far_and_long_it_goes() -> None:
    runner = _oracle_runner()
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", observation=obs)]))
    s = runner.sessions["s"]
    for i in range(REANCHOR_FRAMES + 40):  # past the age limit and out of view: the served runner re-anchors
        _right(runner, i)
    assert torch.equal(WorldModel.decode(s.ref.anchor), torch.from_numpy(obs))
    assert torch.allclose(s.ref.offset, torch.tensor([0.0, -(REANCHOR_FRAMES + 40.0)]))
    view = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    runner.refresh("s", view)
    assert torch.equal(WorldModel.decode(s.ref.anchor), torch.from_numpy(view))
    assert torch.allclose(s.ref.offset, torch.zeros(2))
    _right(runner, REANCHOR_FRAMES + 40)
    assert torch.allclose(s.ref.offset, torch.tensor([0.0, -1.0]))


def test_an_oracle_refreshes_on_its_period_and_refuses_what_training_never_showed() -> None:
    o = Oracle("frame", 8)
    assert [t for t in range(30) if o.due(t)] == [8, 16, 24]
    assert o.label == "oracle-frame-8"
    assert Oracle.parse("ground:1", 8) == Oracle("ground", 1) and Oracle.parse("frame", 12) == Oracle("frame", 12)
    with pytest.raises(ValueError, match="ground:x"):
        Oracle.parse("ground:x", 8)
    with pytest.raises(ValueError, match="view"):
        Oracle("canvas", 8)
    with pytest.raises(ValueError, match="1 to 16"):
        Oracle("ground", 32)



def test_the_tokens_view_is_the_ground_through_the_tokenizer() -> None:
    from worldserve.world.scene import SceneAttrs

    world = World(3, SceneAttrs(), (64,))
    world.reset((200.0, 200.0))
    ground, tokens = Oracle("ground", 1).view_of(world, 64), Oracle("tokens", 1).view_of(world, 64)
    assert tokens.shape == ground.shape and tokens.dtype == np.uint8
    err = np.mean((tokens.astype(np.float64) - ground.astype(np.float64)) ** 2)
    assert 0 < err < 255**2 / 10 ** (20 / 10)  # a reconstruction above 20 dB, not a copy
