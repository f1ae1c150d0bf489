"""Does the model obey? Keys (``control_acc``: the view's global motion between frames against
the commanded shift) and the scene prompt (``scene_ok``: a switch moves the view's colours to
the new scene's), for ``bench.quality``'s weights and for the same weights on the world canvas."""

from __future__ import annotations

import numpy as np

from worldserve.bench._driver import Driver, Rollouts, make_worlds, rollouts
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import ACTION_DIM
from worldserve.world import expected_shift, global_shift, mixed_policy, sample_scene

CONTROL_EPISODES = 24  # --quick too: a score from a handful of episodes hangs on whether one is in snow
DESPECKLE = 5  # median window (px at 64): removes snowflakes and most of a rain streak
BAND = 0.15  # cycles per pixel: the Gaussian weight on the whitened cross-spectrum


def motion_ok(prev: np.ndarray, cur: np.ndarray, action: np.ndarray, bucket: int, filtered: bool = True) -> bool | None:
    """Does the ground's shift prev -> cur match the action's? None when the action is still.

    The frames are median-filtered and the phase correlation band-limited first: falling
    snow and rain move on their own, and unfiltered (``filtered=False``) they outvote a dim
    or bare ground; ``control_acc_renderer_plain`` is the renderer's score that way."""
    want = np.round(np.asarray(expected_shift(action, bucket), dtype=np.float64))
    if not np.any(want):
        return None
    scale = bucket // 64 or 1
    kw = {"despeckle": DESPECKLE * scale | 1, "band": BAND / scale} if filtered else {}
    got = global_shift(prev, cur, **kw)
    return bool(np.all(np.abs(np.asarray(got, dtype=np.float64) - want) <= 1.0))


def control_steps(roll: Rollouts, filtered: bool = True) -> tuple[list[list[bool]], list[list[bool]]]:
    """Per episode, ``motion_ok`` of the model's and of the renderer's frames at every step
    whose action moves the camera."""
    bucket = roll.truth.shape[2]
    model_ok: list[list[bool]] = []
    truth_ok: list[list[bool]] = []
    for i in range(roll.truth.shape[0]):
        model_ok.append([])
        truth_ok.append([])
        for t in range(1, roll.truth.shape[1]):
            m = motion_ok(roll.model[i, t - 1], roll.model[i, t], roll.actions[i, t], bucket, filtered)
            r = motion_ok(roll.truth[i, t - 1], roll.truth[i, t], roll.actions[i, t], bucket, filtered)
            if m is not None:
                model_ok[-1].append(m)
                truth_ok[-1].append(bool(r))
    return model_ok, truth_ok


def control_rollouts(
    runner: ModelRunner, bucket: int, episodes: int, length: int, rng: np.random.Generator,
) -> tuple[Rollouts, list[str]]:
    """Rollouts for action control only, on worlds of their own (``CONTROL_EPISODES``, more
    than the PSNR episodes: one snowfall episode more or less moves a 12-episode score by
    several points). Returns them with each episode's weather."""
    worlds = make_worlds(episodes, bucket, rng, 400)
    actions = np.stack([mixed_policy(length, rng) for _ in worlds]).astype(np.float32)
    return rollouts(runner, bucket, worlds, actions, seed=7), [w.scene.weather for w in worlds]


def control_by_weather(
    model_ok: list[list[bool]], truth_ok: list[list[bool]], weather: list[str],
) -> dict[str, tuple[float, float, int]]:
    """{weather: (model share, renderer share, steps)} over the episodes of each weather."""
    out = {}
    for w in sorted(set(weather)):
        m = [ok for oks, ww in zip(model_ok, weather, strict=True) if ww == w for ok in oks]
        r = [ok for oks, ww in zip(truth_ok, weather, strict=True) if ww == w for ok in oks]
        if m:
            out[w] = (float(np.mean(m)), float(np.mean(r)), len(m))
    return out


def scene_switch(runner: ModelRunner, bucket: int, episodes: int, rng: np.random.Generator) -> bool:
    """Switch every session's prompt after 12 frames; within 4 frames the model's mean colour
    must be nearer the renderer's new-scene frames than its old-scene frames."""
    worlds = make_worlds(episodes, bucket, rng, 100)
    drv = Driver(runner, bucket)
    old = [w.scene for w in worlds]
    new = [sample_scene(rng) for _ in worlds]
    for i in range(episodes):  # make sure the look really changes
        while new[i].to_prompt() == old[i].to_prompt():
            new[i] = sample_scene(rng)
    drv.open(np.stack([w.render(bucket) for w in worlds]), [s.to_prompt() for s in old], seed=2)
    actions = np.zeros((episodes, ACTION_DIM), np.float32)
    actions[:, 3] = 1.0  # move right the whole time
    for _ in range(12):
        drv.step(actions)
        for w in worlds:
            w.step(actions[0])
    drv.scene([s.to_prompt() for s in new])
    ok = []
    for _ in range(4):
        frames = drv.step(actions)
        for w in worlds:
            w.step(actions[0])
        old_look, new_look = [], []
        for i, w in enumerate(worlds):
            w.set_scene(old[i])
            old_look.append(w.render(bucket).reshape(-1, 3).mean(0))
            w.set_scene(new[i])
            new_look.append(w.render(bucket).reshape(-1, 3).mean(0))
        got = frames.reshape(episodes, -1, 3).mean(1)
        ok = [np.linalg.norm(got[i] - new_look[i]) < np.linalg.norm(got[i] - old_look[i]) for i in range(episodes)]
    drv.close()
    return float(np.mean(ok)) >= 0.75


def steering(runner: ModelRunner, bucket: int, episodes: int, length: int, seed: int,
             control_episodes: int = CONTROL_EPISODES) -> tuple[dict[str, float], dict[str, tuple[float, float, int]]]:
    """``control_acc`` (with the renderer's own score, plain and filtered, and the model's over
    the steps the renderer passes) on ``control_episodes`` worlds of their own, and ``scene_ok``
    on ``episodes`` more; the same worlds and scripts for every runner of one ``seed``.
    Returns them with control per weather (``control_by_weather``)."""
    ctl, weather = control_rollouts(runner, bucket, control_episodes, length, np.random.default_rng([seed, bucket, 2]))
    model_steps, truth_steps = control_steps(ctl)
    by_weather = control_by_weather(model_steps, truth_steps, weather)
    plain = [ok for e in control_steps(ctl, filtered=False)[1] for ok in e]
    model_ok, truth_ok = [ok for e in model_steps for ok in e], [ok for e in truth_steps for ok in e]
    judged = [m for m, r in zip(model_ok, truth_ok, strict=True) if r]  # where the measure works on the world
    res = {
        "control_acc": float(np.mean(model_ok)) if model_ok else float("nan"),
        "control_acc_renderer": float(np.mean(truth_ok)) if truth_ok else float("nan"),
        "control_acc_renderer_plain": float(np.mean(plain)) if plain else float("nan"),
        "control_acc_judged": float(np.mean(judged)) if judged else float("nan"),
        "scene_ok": float(scene_switch(runner, bucket, episodes, np.random.default_rng([seed, bucket, 5]))),
    }
    return res, by_weather


def steering_fields(res: dict[str, float]) -> str:
    """``control_acc=.. control_acc_judged=.. scene_ok=0|1`` from ``steering``'s figures."""
    return (f"control_acc={res['control_acc']:.3f} control_acc_judged={res['control_acc_judged']:.3f} "
            f"scene_ok={int(res['scene_ok'])}")


def steering_line(label: str, runner: ModelRunner, bucket: int, episodes: int, length: int, seed: int) -> str:
    """``label control_acc=.. control_acc_judged=.. scene_ok=0|1`` for another runner (the
    canvas) on the worlds and scripts ``steering`` gives the weights of the same ``seed``."""
    return f"{label} {steering_fields(steering(runner, bucket, episodes, length, seed)[0])}"
