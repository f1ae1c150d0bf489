"""bench.realism_motion's measures: the committed actor detector finds actors planted in a
world's view; tracks of moving detections read their speed and continuity with the camera's
shift taken out; the weather's drift reads the world's wind on a live world and none on its
frozen copy; a camera-stabilised pair of a frozen world shows no difference; the motion
two-sample test tells moving things from still ones; the summary line is key=value; kept
frames come back as the rows they were."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from worldserve.bench import _motion_measures as mm
from worldserve.bench.actor_detector import (
    DEFAULT_PATH,
    MATCH_PX,
    anchors_in_view,
    detect_all,
    heat_target,
    load_detector,
    match_counts,
)
from worldserve.bench.realism_motion import Run, Worlds, pack, summary_line, unpack
from worldserve.world import World, WorldState
from worldserve.world.actors import ANIMAL, BOAT, Actors


def _planted(world: World, pos: np.ndarray, kind: np.ndarray) -> None:
    st = world.state
    n = len(kind)
    actors = Actors(kind=kind.astype(np.int64), variant=np.zeros(n, np.int64), pos=pos.astype(np.float64),
                    heading=np.linspace(0, 3, n), speed=np.zeros(n), target=np.zeros(n), timer=np.full(n, 99))
    world.restore(WorldState(st.frame, st.clock, st.position, actors, st.rng_state))


@pytest.mark.skipif(not DEFAULT_PATH.exists(), reason="the detector's weights are not built")
def test_the_detector_finds_boats_planted_on_open_water_and_reads_the_water() -> None:
    world = World(987, "a green grassland at noon", (64,), map_size=256)
    water = np.argwhere(world.layout.walk_water)
    deep = water[[bool(world.layout.walk_water[(y + np.arange(-12, 13)) % 256][:, (x + np.arange(-12, 13)) % 256].all())
                  for y, x in water]]
    centre = deep[0].astype(float) + 0.5
    world.reset(centre)
    _planted(world, centre + np.array([[-8.0, -8.0], [8.0, 6.0]]), np.array([BOAT, BOAT]))
    truth = anchors_in_view(world)
    net = load_detector()
    found, share = detect_all(net, world.render(64)[None])
    counts = match_counts(found[0], truth, MATCH_PX)
    assert counts[1].tolist() == [2, 2, 2], (found, truth)  # both boats, nothing else called a boat
    assert share[0] > 0.3  # open water around them


def test_heat_target_peaks_at_each_anchor_in_its_kinds_channel() -> None:
    heat = heat_target(np.array([[5, 7], [40, 30]]), np.array([ANIMAL, BOAT]))
    assert heat[0, 5, 7] == 1 and heat[1, 40, 30] == 1 and heat[0, 40, 30] < 1e-6


def test_tracks_read_speed_and_continuity_with_the_camera_shift_taken_out() -> None:
    t_len = 40
    actions = np.zeros((t_len, 6), np.float32)
    actions[:, 3] = 1  # right: the camera moves 2 px a frame, the ground slides left
    cam = mm.camera_px(actions, 64)
    ground = np.array([30.0, 20.0]) + np.arange(t_len)[:, None] * np.array([0.0, 0.5])  # 0.5 px a frame
    dets = []
    for t in range(t_len):
        p = np.rint(ground[t] - cam[t]).astype(np.int64)
        dets.append((p[None], np.array([BOAT])) if t < 30 else (np.zeros((0, 2), np.int64), np.zeros(0, np.int64)))
    tracks = mm.link_tracks(dets, cam)
    assert len(tracks) == 1 and tracks[0].frames == list(range(30))
    speeds = mm.track_speeds(tracks)[BOAT]
    assert np.allclose(speeds, 0.5, atol=0.1)
    cont = mm.continuity(tracks, cam, 64, range(0, 1))[BOAT]
    assert cont == [1.0]  # it leaves the view (ground slides left) while still tracked
    nothing = (np.zeros((0, 2), np.int64), np.zeros(0, np.int64))
    still = [(np.array([[30, 30]]), np.array([ANIMAL])) if t < 10 else nothing for t in range(t_len)]
    broken = mm.continuity(mm.link_tracks(still, np.zeros((t_len, 2))), np.zeros((t_len, 2)), 64, range(0, 1))
    assert broken[ANIMAL] == [pytest.approx(10 / 24)]


def _weather_run(animate: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    world = World(987, "a cloudy grassland at noon", (64,), map_size=256, animate=animate)
    world.reset((100.0, 100.0))
    actions = np.zeros((40, 6), np.float32)
    actions[:, 2] = 1  # left
    frames, grounds = [world.render(64)], [world.render_ground(64)]
    for a in actions[1:]:
        world.step(a)
        frames.append(world.render(64))
        grounds.append(world.render_ground(64))
    return np.stack(frames), np.stack(grounds), mm.camera_px(actions, 64)


def test_the_weather_drift_reads_the_wind_when_the_world_lives_and_none_when_frozen() -> None:
    wind = np.array(World(987, "a cloudy grassland at noon", (64,), map_size=256).layout.wind)
    for animate in (True, False):
        frames, grounds, cam = _weather_run(animate)
        fields = mm.weather_field(frames, grounds)
        assert mm.cover(fields) > 0.05  # this view has cloud shadows
        vy, vx, n = mm.drift(fields, cam, range(24, 40, 4))
        assert n >= 3
        want = wind if animate else np.zeros(2)
        assert np.hypot(vy - want[0], vx - want[1]) < 0.1, (vy, vx, want)


def _steady_differences(animate: bool) -> np.ndarray:
    """Grey levels of ``steady_difference`` on the seen pixels of pairs of a world under keys
    and mouse (sub-pixel shifts), with one boat sailing through the view."""
    world = World(987, "a green grassland at noon", (64,), map_size=256, animate=animate)
    water = np.argwhere(world.layout.walk_water)
    deep = water[[bool(world.layout.walk_water[(y + np.arange(-8, 9)) % 256][:, (x + np.arange(-8, 9)) % 256].all())
                  for y, x in water]]
    world.reset(deep[0].astype(float) + 0.5)
    _planted(world, deep[0][None] + 0.5, np.array([BOAT]))
    acts = world.state.actors
    acts.speed[:], acts.target[:] = 0.8, 0.8
    world.restore(WorldState(0, 0, world.position, acts, world.state.rng_state))
    actions = np.zeros((30, 6), np.float32)
    actions[:, 0], actions[:, 4] = 0.2, 0.15  # forward and the mouse: sub-pixel shifts
    frames = [world.render(64)]
    for a in actions[1:]:
        world.step(a)
        frames.append(world.render(64))
    pairs = mm.motion_pairs(np.stack(frames), mm.camera_px(actions, 64), range(24, 30))
    return pairs[:, 3][pairs[:, 4] > 0] * 32


def test_a_stabilised_pair_shows_a_sailing_boat_and_next_to_nothing_of_a_frozen_world() -> None:
    still, live = _steady_differences(False), _steady_differences(True)
    assert len(still) > 6 * 64 * 16
    assert (still > 12).mean() < 0.002  # the camera's sub-pixel rest, a few edge pixels
    assert (live > 12).sum() > 20 * 6  # the boat: tens of pixels in every pair


def test_the_motion_test_tells_a_moving_dot_from_a_still_one() -> None:
    rng = np.random.default_rng(0)
    n = 64
    a = np.zeros((n, 5, 16, 16), np.float32)
    b = np.zeros((n, 5, 16, 16), np.float32)
    a[:, 4] = b[:, 4] = 1
    for x in (a, b):
        x[:, :3] = rng.normal(0, 0.1, (n, 3, 16, 16))
    ys, xs = rng.integers(2, 14, n), rng.integers(2, 14, n)
    a[np.arange(n), 3, ys, xs] = 1.0  # a thing that moved: a spot in the difference
    groups = np.repeat(np.arange(8), n // 8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny network: more threads only wait on each other
    try:
        acc = mm.motion_c2st(a, b, groups, groups, mm.MotionC2STConfig(widths=(8, 16), epochs=20, batch=16), folds=2)
    finally:
        torch.set_num_threads(threads)
    assert acc > 0.9


def test_the_summary_line_is_key_value_and_says_void_where_the_control_fails() -> None:
    r = {"c2st_2s": 0.6, "c2st_10s": 0.7, "c2st_60s": 0.7, "density_ratio": 0.1, "speed_ratio": float("nan"),
         "c2st_motion_10s": 0.8, "motion_control_10s": 0.95, "c2st_motion_60s": 0.8, "motion_control_60s": 0.5}
    line = summary_line("canvas", r, {"density_ratio": 0.0})
    head, label, *fields = line.split()
    assert (head, label) == ("realism", "canvas")
    kv = dict(f.split("=") for f in fields)
    assert kv["c2st_motion_10s"] == "0.800" and kv["c2st_motion_60s"] == "VOID"
    assert kv["passthrough_actors_ratio"] == "0.000" and float(kv["c2st_2s"]) == 0.6


def test_kept_frames_come_back_as_the_rows_they_were() -> None:
    frames = {"2s": np.zeros((4, 56, 64, 64, 3), np.uint8)}
    w = Worlds([1, 2, 3, 4], ["a"] * 4, np.zeros((4, 65, 6)), np.zeros((4, 65, 2)), Run(frames), Run(frames),
               Run(frames), {"2s": np.zeros((4, 56))}, np.zeros((4, 64, 64, 3), np.uint8), np.zeros((4, 2)))
    rows = {"world": w.world, "canvas": Run({"2s": np.ones((4, 56, 64, 64, 3), np.uint8)})}
    back, rows2, rv, log = unpack(pickle.loads(pickle.dumps(pack(w, rows, {"revisit_world": 1.0}, ["x"]))))
    assert back.seeds == w.seeds and back.grounds.frames["2s"].shape == (4, 56, 64, 64, 3)
    assert rows2["canvas"].frames["2s"].max() == 1 and rv == {"revisit_world": 1.0} and log == ["x"]
