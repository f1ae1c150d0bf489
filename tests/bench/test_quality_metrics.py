import numpy as np

from worldserve.bench._control import control_by_weather, control_steps
from worldserve.bench._driver import Rollouts
from worldserve.bench._frame_measures import pooled_psnr, psnr
from worldserve.bench.quality import (
    best_aligned,
    episode_lines,
    region_psnr,
    shift_oracle,
    shifted,
)
from worldserve.session.plan import ACTION_DIM, KEYS
from worldserve.world import expected_shift


def test_pooled_psnr_is_the_psnr_of_the_mean_error() -> None:
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 256, (3, 8, 8, 3)).astype(np.uint8)
    pred = np.clip(truth.astype(np.int16) + rng.integers(-20, 21, truth.shape), 0, 255).astype(np.uint8)
    err = np.mean((pred.astype(np.float64) - truth) ** 2)
    assert abs(pooled_psnr(pred, truth) - 10 * np.log10(255.0**2 / err)) < 1e-9
    assert abs(pooled_psnr(pred[:1], truth[:1]) - psnr(pred[0], truth[0])) < 1e-9


def test_one_identical_episode_does_not_outweigh_the_rest() -> None:
    rng = np.random.default_rng(1)
    truth = rng.integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    pred = truth.copy()
    pred[1:] = 255 - truth[1:]  # three episodes badly wrong, one exact
    per_episode_mean = np.mean([psnr(p, t) for p, t in zip(pred, truth, strict=True)])
    assert per_episode_mean > 35  # the exact pair's +148 dB drags the dB mean up
    assert pooled_psnr(pred, truth) < 10


def test_shifted_moves_content_and_marks_what_was_never_seen() -> None:
    frame = np.random.default_rng(2).integers(0, 256, (8, 8, 3)).astype(np.uint8)
    out = shifted(frame, 2, -3)
    assert np.array_equal(out[2:, :5], frame[:6, 3:].astype(np.float64))
    assert np.isnan(out[:2]).all() and np.isnan(out[:, 5:]).all()
    half = shifted(frame, 0, 0.5)[:, 1:]  # sub-pixel: the average of the two neighbours
    assert np.allclose(half, (frame[:, :-1].astype(np.float64) + frame[:, 1:]) / 2)


def test_shift_oracle_follows_the_commanded_camera() -> None:
    rng = np.random.default_rng(3)
    first = rng.integers(0, 256, (64, 64, 3)).astype(np.uint8)
    right = np.zeros(ACTION_DIM, np.float32)
    right[KEYS.index("right")] = 1.0
    dy, dx = expected_shift(right, 64)
    assert (dy, dx) == (0.0, -2.0)  # the scene slides left by 2 px at 64 px
    truth = np.stack([first, np.roll(first, -2, axis=1)])[None]  # (1 episode, 2 frames)
    actions = np.stack([np.zeros_like(right), right])[None]
    ref = shift_oracle(truth, actions, 1, 64, sharp=False)[0]
    assert np.array_equal(ref[:, :62], truth[0, 1, :, :62].astype(np.float64))
    assert np.allclose(ref[:, 62:], first.reshape(-1, 3).mean(0))
    sharp = shift_oracle(truth, actions, 1, 64, sharp=True)[0]
    assert np.array_equal(sharp[:, :62], ref[:, :62]) and not np.allclose(sharp[:, 62:], ref[:, 62:])


def test_region_psnr_splits_carried_content_from_new_content() -> None:
    rng = np.random.default_rng(4)
    first = rng.integers(0, 256, (64, 64, 3)).astype(np.uint8)
    right = np.zeros(ACTION_DIM, np.float32)
    right[KEYS.index("right")] = 1.0
    truth = np.stack([first, np.roll(first, -2, axis=1)])[None]
    model = truth.copy()
    model[0, 1, :, 62:] = 255 - truth[0, 1, :, 62:]  # right where carried, wrong where new
    roll = Rollouts(truth=truth, model=model, actions=np.stack([np.zeros_like(right), right])[None])
    res = region_psnr(roll, 1, 64)
    assert res["psnr_h1_known_model"] > 100 and res["psnr_h1_unseen_model"] < 10
    assert res["psnr_h1_known_repeat"] < 20  # repeat-last did not carry the content along
    assert res["psnr_h1_known_oracle"] > 100  # the exact shift did


def test_best_aligned_forgives_position_and_nothing_else() -> None:
    rng = np.random.default_rng(5)
    truth = rng.integers(0, 256, (32, 32, 3)).astype(np.uint8)
    inner = np.zeros((32, 32), bool)
    inner[4:-4, 4:-4] = True
    off_by_one = np.roll(truth, (1, -1), (0, 1))
    assert best_aligned(off_by_one, truth, inner) == 0.0  # the right offset puts it back
    blurred = ((truth.astype(np.float64) + np.roll(truth, 1, 1)) / 2).astype(np.uint8)
    plain = float(((blurred.astype(np.float64) - truth) ** 2).sum(-1)[inner].sum())
    assert 0.2 * plain < best_aligned(blurred, truth, inner) <= plain  # lost detail stays lost


def test_episode_lines_name_each_episode_and_mark_a_static_view() -> None:
    rng = np.random.default_rng(6)
    frames = rng.integers(0, 256, (2, 33, 16, 16, 3)).astype(np.uint8)
    frames[1] = frames[1, :1]  # episode 1 never changes: repeat-last is exact
    model = frames.copy()
    model[:, 1:] = 255 - model[:, 1:]
    actions = np.zeros((2, 33, ACTION_DIM), np.float32)
    actions[0, :, KEYS.index("right")] = 1.0
    lines = episode_lines(Rollouts(frames, model, actions, ["a snowy night", "a sunny day"]))
    assert len(lines) == 2
    assert "a snowy night" in lines[0] and "moving" in lines[0]
    assert "a sunny day" in lines[1] and "still" in lines[1] and "inf" in lines[1]


def test_control_steps_score_each_moving_step_of_model_and_renderer() -> None:
    rng = np.random.default_rng(7)
    base = np.kron(rng.random((8, 8)), np.ones((8, 8))) * 200
    frames = np.stack([np.roll(base, (0, -2 * t), (0, 1)) for t in range(5)])  # "right": view moves -2 px in x
    truth = np.repeat(frames[..., None], 3, -1).astype(np.uint8)[None]
    model = truth.copy()
    model[0, 3:] = model[0, 2]  # the model stops following the camera after frame 2
    actions = np.zeros((1, 5, ACTION_DIM), np.float32)
    actions[0, 1:, KEYS.index("right")] = 1.0
    actions[0, 4] = 0.0  # a still step is not scored
    roll = Rollouts(truth, model, actions, ["a day"])
    per_model, per_truth = control_steps(roll)
    assert per_truth == [[True, True, True]]
    assert per_model == [[True, True, False]]
    assert "control 2/3" in episode_lines(roll, horizons=(1, 4), control=per_model)[0]


def test_control_by_weather_pools_the_steps_of_each_weather() -> None:
    model_ok = [[True, False], [True, True, True], [False]]
    truth_ok = [[True, True], [True, True, False], [True]]
    out = control_by_weather(model_ok, truth_ok, ["snowfall", "clear", "snowfall"])
    assert out["clear"] == (1.0, 2 / 3, 3)
    assert out["snowfall"] == (1 / 3, 1.0, 3)


def test_the_long_rollout_keeps_frames_for_a_strip(tmp_path) -> None:
    from PIL import Image

    from tests.model.conftest import make_runner, tiny_config
    from worldserve.bench.quality import long_rollout, save_long_strip

    runner = make_runner(tiny_config(buckets=(64,), base_bucket=64), max_sessions=4)
    frames: list = []
    lines: list[str] = []
    res = long_rollout(runner, 64, 2, 40, np.random.default_rng(0), frames, lines)
    assert res["finite"] == 1.0 and len(frames) == 7  # frames 5, 10, .., 35
    assert len(lines) == 2 and all("contrast model / renderer" in line for line in lines)
    assert all(t.shape == m.shape == (2, 64, 64, 3) for t, m in frames)
    save_long_strip(frames, tmp_path, 64)
    img = np.asarray(Image.open(tmp_path / "long_64.png"))
    assert img.shape == (2 * 4 * 64, 2 * 7 * 64, 3)  # per episode renderer over model, 2x scale
    assert np.array_equal(img[::2, ::2][:64, :64], frames[0][0][0])  # top left: the renderer's first
    assert 0.0 <= res["colour_late"] <= 1.0
    assert 0.0 <= res["anisotropy_late"] <= 1.0 and 0.0 <= res["anisotropy_late_renderer"] <= 1.0
    assert 0.0 < res["texture_late"] <= 20.0 and 0.0 < res["texture_late_renderer"] <= 20.0


def test_stripes_score_as_anisotropic_and_the_worlds_ground_does_not() -> None:
    from worldserve.bench._frame_measures import anisotropy
    from worldserve.world import World

    stripes = np.zeros((64, 64, 3), np.uint8)
    stripes[::4] = 200  # horizontal streaks: all the gradient runs along y
    assert anisotropy(stripes) > 0.95
    assert anisotropy(stripes.transpose(1, 0, 2)) > 0.95
    ground = World(seed=7, map_size=256).render(64)
    assert anisotropy(ground) < 0.3


def test_colour_overlap_is_one_for_the_same_colours_and_falls_for_others() -> None:
    from worldserve.bench._frame_measures import colour_hist, hist_intersection

    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (32, 32, 3)).astype(np.uint8)
    shuffled = rng.permutation(frame.reshape(-1, 3)).reshape(frame.shape)  # same colours, elsewhere
    assert hist_intersection(colour_hist(frame), colour_hist(shuffled)) == 1.0
    dark = (frame // 4).astype(np.uint8)
    assert hist_intersection(colour_hist(frame), colour_hist(dark)) < 0.2
    assert colour_hist(frame).sum() == 32 * 32


def test_blocks_drawn_per_token_show_as_seams_and_the_worlds_ground_does_not() -> None:
    from worldserve.bench._frame_measures import seams
    from worldserve.world import World

    rng = np.random.default_rng(0)
    blocks = np.kron(rng.integers(0, 256, (4, 4, 3)), np.ones((16, 16, 1))).astype(np.uint8)
    blocks = np.clip(blocks.astype(np.int16) + rng.integers(-3, 4, blocks.shape), 0, 255).astype(np.uint8)
    assert seams(blocks, 16) > 5.0  # flat tokens: every step is on a grid line
    assert seams(np.roll(blocks, 8, (0, 1)), 16) < 1.0  # the same blocks off the grid
    ground = World(seed=7, map_size=256).render(64)
    assert 0.7 < seams(ground, 16) < 1.4
