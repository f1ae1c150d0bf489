"""The anchor reference: one resample of an anchor frame by the summed camera shift, the head's
per-pixel copy from it, and the runner's anchor state through a session's life."""

from __future__ import annotations

import numpy as np
import torch

from tests.model.conftest import make_runner, randomized, tiny_config
from worldserve.bench.quality import shifted
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.reference.anchor import (
    REANCHOR_SHARE,
    SCENE_SETTLE_FRAMES,
    anchor_reference,
    visible_share,
)
from worldserve.session.plan import (
    ACTION_DIM,
    KEYS,
    Batch,
    ChunkWork,
    SessionSpec,
    SessionUpdate,
    StepPlan,
)
from worldserve.training.targets import anchor_offsets


def test_the_reference_is_the_anchor_moved_as_the_bench_moves_it() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    for dy, dx in ((0.0, 0.0), (1.5, -2.25), (-7.0, 3.75)):
        want = shifted(frame, dy, dx)  # float pixels, NaN where the anchor never showed
        ref = anchor_reference(WorldModel.encode(torch.from_numpy(frame))[None], torch.tensor([[dy, dx]]))[0]
        seen = ref[3].numpy() > 0
        assert np.array_equal(seen, ~np.isnan(want[..., 0]))
        got = (ref[:3].permute(1, 2, 0).numpy() + 1) * 127.5
        assert np.abs(got[seen] - want[seen]).max() < 1e-3
        assert np.all(ref[:3].numpy()[:, ~seen] == 0.0)
    none = anchor_reference(torch.ones(1, 3, 8, 8), torch.zeros(1, 2), torch.tensor([False]))
    assert float(none.abs().sum()) == 0.0


def test_visible_share_is_the_overlap_left() -> None:
    share = visible_share(torch.tensor([[0.0, 0.0], [0.0, 31.0], [15.5, 15.5]]), 32)
    assert torch.allclose(share, torch.tensor([1.0, 0.0, 0.25]))


def test_offsets_sum_the_camera_shift_from_the_anchor_and_stop_at_a_prompt_change() -> None:
    acts = np.zeros((2, 5, ACTION_DIM), np.float32)
    acts[:, :, KEYS.index("right")] = 1.0  # the scene moves 2 px left per frame at 64
    scenes = np.zeros((2, 5, 3), np.float32)
    scenes[1, 3:, 0] = 1.0  # sequence 1 changes prompt at frame 3
    offsets, valid = anchor_offsets(acts, scenes, 0, 64)
    assert np.allclose(offsets[0, :, 1], [0, -2, -4, -6, -8]) and np.allclose(offsets[..., 0], 0)
    assert valid[0].tolist() == [False, True, True, True, True]
    assert valid[1].tolist() == [False, True, True, False, False]
    offsets, valid = anchor_offsets(acts, scenes, 1, 64)  # after a far sink: frame 1 anchors
    assert np.allclose(offsets[0, :, 1], [0, 0, -2, -4, -6]) and valid[0].tolist() == [False, False, True, True, True]


def _frame(model: WorldModel, prev: torch.Tensor, open_logit: float) -> torch.Tensor:
    for head in model.anchor_heads.values():
        torch.nn.init.constant_(head.weight, 0.0)
        torch.nn.init.constant_(head.bias, open_logit)
    b, n = prev.shape[:2]
    x = torch.zeros(b, n, 3, *prev.shape[-2:])
    scene = torch.zeros(b, model.cfg.scene_dim)
    out, _ = model.forward_sequence(x, prev, torch.full((b, n), 0.5), torch.zeros(b, n, ACTION_DIM),
                                    scene, torch.arange(n), torch.ones(n, dtype=torch.bool))
    return out


def test_the_head_copies_the_reference_where_it_is_valid_and_the_mix_opens() -> None:
    model = randomized(tiny_config())
    for stem in model.anchor_stems.values():  # the tokens do not see the reference: only the head does
        torch.nn.init.zeros_(stem.weight)
    torch.manual_seed(1)
    prev = torch.rand(1, 2, model.cfg.prev_channels, 32, 32) * 2 - 1
    prev[:, :, 6] = 0.0
    prev[:, :, 6, :, :20] = 1.0  # the reference shows the left 20 columns only
    other = prev.clone()
    other[:, :, 3:6] = torch.rand(1, 2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        closed, opened, opened2 = _frame(model, prev, -60.0), _frame(model, prev, 60.0), _frame(model, other, 60.0)
    # open: each valid pixel is the reference plus the same residual; closed: the warp alone
    assert torch.allclose(opened[..., :20] - opened2[..., :20], (prev - other)[:, :, 3:6, :, :20], atol=1e-5)
    assert torch.allclose(opened[..., 20:], closed[..., 20:]) and torch.allclose(opened2[..., 20:], closed[..., 20:])
    assert torch.allclose(_frame(model, other, -60.0), closed)  # closed, the reference's colours do not matter


def _anchor_runner():
    cfg = tiny_config()
    runner = make_runner(cfg)
    with torch.no_grad():  # the scene moves 1 px left per frame at 32 px under "right"
        runner.model.shift_head.weight.zero_()
        runner.model.shift_head.bias.zero_()
        runner.model.shift_head.weight[1, KEYS.index("right")] = -1.0
    return runner


def _step(runner, sid: str, block: int, key: str | None = "right", bucket: int = 32) -> np.ndarray:
    a = np.zeros((1, ACTION_DIM), np.float32)
    if key:
        a[0, KEYS.index(key)] = 1.0
    out = runner.execute(StepPlan(batches=[Batch(bucket, 2, [ChunkWork(sid, block, a)])]))
    assert not out.errors, out.errors
    return out.results[0].frames


def test_the_runner_anchors_on_observations_and_sums_the_shift() -> None:
    runner = _anchor_runner()
    obs = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", observation=obs)]))
    s = runner.sessions["s"]
    assert s.ref.anchor is not None and torch.equal(WorldModel.decode(s.ref.anchor), torch.from_numpy(obs))
    for i in range(3):
        _step(runner, "s", i)
    assert torch.allclose(s.ref.offset, torch.tensor([0.0, -3.0]))
    _step(runner, "s", 3, key=None)  # still: nothing added
    assert torch.allclose(s.ref.offset, torch.tensor([0.0, -3.0]))
    # far enough that under a quarter of the anchor stays in view: the newest frame anchors
    steps = int(np.ceil(31 * (1 - REANCHOR_SHARE))) - 3
    for i in range(steps):
        _step(runner, "s", 4 + i)
    assert torch.allclose(s.ref.offset, torch.zeros(2)) and torch.equal(s.ref.anchor, s.prev)


def test_a_prompt_change_drops_the_anchor_until_the_view_has_recoloured() -> None:
    runner = _anchor_runner()
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x")]))
    s = runner.sessions["s"]
    _step(runner, "s", 0)
    assert s.ref.anchor is not None  # no observation: the first frame made anchors
    runner.execute(StepPlan(updates=[SessionUpdate("s", scene="y")]))
    assert s.ref.anchor is None
    for i in range(SCENE_SETTLE_FRAMES - 1):
        _step(runner, "s", 1 + i)
        assert s.ref.anchor is None
    _step(runner, "s", SCENE_SETTLE_FRAMES)
    assert s.ref.anchor is not None and torch.equal(s.ref.anchor, s.prev)


def test_a_restore_keeps_the_anchor_and_its_shift() -> None:
    a, b = _anchor_runner(), _anchor_runner()
    a.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x")]))
    for i in range(4):
        _step(a, "s", i)
    src = a.sessions["s"]
    assert src.ref.anchor is not None and not torch.equal(src.ref.anchor, src.prev)  # an older anchor
    b.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", restore=a.export_state("s"))]))
    s = b.sessions["s"]
    assert s.ref.anchor is not None and torch.equal(s.ref.anchor, src.ref.anchor) and torch.equal(s.prev, src.prev)
    assert torch.equal(s.ref.offset, src.ref.offset) and (s.ref.age, s.ref.wait) == (src.ref.age, src.ref.wait)


def test_a_restore_without_family_state_and_a_bucket_switch_anchor_on_the_newest_frame() -> None:
    a, b = _anchor_runner(), _anchor_runner()
    a.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x")]))
    for i in range(4):
        _step(a, "s", i)
    state = a.export_state("s")
    state.family_state = {}  # as a family that keeps none
    b.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", restore=state)]))
    s = b.sessions["s"]
    assert torch.equal(s.ref.anchor, s.prev) and torch.allclose(s.ref.offset, torch.zeros(2))
    b.execute(StepPlan(updates=[SessionUpdate("s", bucket=64)]))
    assert s.ref.anchor is not None and s.ref.anchor.shape[-1] == 64 and torch.equal(s.ref.anchor, s.prev)
    _step(b, "s", 4, bucket=64)
    assert torch.allclose(s.ref.offset, torch.tensor([0.0, -2.0]))  # twice the pixels at twice the size


def test_a_batch_of_anchored_sessions_gives_each_what_it_gets_alone() -> None:
    def run(ids: list[str], seeds: list[int]) -> dict[str, list[np.ndarray]]:
        runner = _anchor_runner()
        specs = [SessionSpec(s, 32, seed=k, scene="x") for s, k in zip(ids, seeds, strict=True)]
        runner.execute(StepPlan(new_sessions=specs))
        out: dict[str, list[np.ndarray]] = {s: [] for s in ids}
        for c in range(6):
            items = []
            for s, k in zip(ids, seeds, strict=True):
                a = np.zeros((1, ACTION_DIM), np.float32)
                a[0, KEYS.index("right" if k % 2 else "back")] = 1.0
                items.append(ChunkWork(s, c, a))
            res = runner.execute(StepPlan(batches=[Batch(32, 2, items)]))
            assert not res.errors
            for r in res.results:
                out[r.session_id].append(r.frames)
        return out

    together = run(["a", "b"], [0, 1])
    for sid, k in (("a", 0), ("b", 1)):
        alone = run([sid], [k])
        diffs = [np.abs(x.astype(int) - y.astype(int)) for x, y in zip(together[sid], alone[sid], strict=True)]
        assert diffs[0].max() <= 1 and max(d.mean() for d in diffs) < 1.0


def test_a_bf16_runner_sums_the_shift_in_fp32() -> None:
    runner = make_runner(tiny_config(), dtype=torch.bfloat16)
    assert runner.model.shift_head.weight.dtype == torch.float32
    with torch.no_grad():
        runner.model.shift_head.weight.zero_()
        runner.model.shift_head.bias.copy_(torch.tensor([0.0, -1.0 / 3]))  # not a bf16 number
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x")]))
    for i in range(4):
        _step(runner, "s", i)
    # the first frame made anchors; three more chunks each add a third of a pixel, exactly
    assert torch.allclose(runner.sessions["s"].ref.offset, torch.tensor([0.0, -1.0]), atol=1e-6)


def test_an_anchor_older_than_training_showed_gives_way_to_the_newest_frame() -> None:
    from worldserve.model.default.reference.anchor import REANCHOR_FRAMES

    runner = _anchor_runner()
    obs = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    runner.execute(StepPlan(new_sessions=[SessionSpec("s", 32, seed=0, scene="x", observation=obs)]))
    s = runner.sessions["s"]
    first = s.ref.anchor
    for i in range(REANCHOR_FRAMES - 1):  # standing still: the view never leaves the anchor
        _step(runner, "s", i, key=None)
    assert torch.equal(s.ref.anchor, first) and s.ref.age == REANCHOR_FRAMES - 1
    _step(runner, "s", REANCHOR_FRAMES - 1, key=None)
    assert s.ref.age == 0 and torch.equal(s.ref.anchor, s.prev)
