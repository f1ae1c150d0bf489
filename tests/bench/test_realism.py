"""worldserve.bench.realism's measures: the two-sample test cannot tell a distribution from itself and
can tell a blur; the Frechet distance of a set with itself is 0 and follows the formula; the
world's own frames are made of the world's patches and blocks are not; the scene network
names the scenes of worlds it never saw; a tiny run of the whole measure writes its strips."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import worldserve.bench._realism_measures as bench_measures
from tests.model.conftest import make_runner, randomized, scene_encoder_for, tiny_config
from worldserve.bench._oracle import Oracle, OracleRunner
from worldserve.bench._realism_measures import (
    C2STConfig,
    blocky,
    blur4,
    c2st_accuracy,
    c2st_readings,
    frechet_distance,
    patch_distance,
    world_folds,
)
from worldserve.bench._scene_features import (
    DEFAULT_PATH,
    HEADS,
    SceneNet,
    labels,
    load_scene_net,
    scene_features,
)
from worldserve.bench.realism import (
    Moment,
    add_out_args,
    beside_weights,
    canvas_lines,
    measure,
    oracle_lines,
    out_dir,
    patch_ratio,
    steer_worlds,
    summary_fields,
    window,
    with_canvas,
)
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.world import World
from worldserve.world.scene import ATTRIBUTES, SceneAttrs

TINY = C2STConfig(widths=(8, 16), crop=24, epochs=6, batch=16, repeats=1)


def textures(
    rng: np.random.Generator, worlds: int, per_world: int, size: int = 32, base: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sharp random ground: per world a base colour (``base`` (worlds, 3), else drawn), per
    frame pixel noise on it."""
    base = rng.integers(60, 196, (worlds, 3)) if base is None else base
    base = base[:, None, None, None, :]
    noise = (rng.normal(0, 40, (worlds, per_world, size, size, 1))
             + rng.normal(0, 10, (worlds, per_world, size, size, 3)))
    frames = np.clip(base + noise, 0, 255).astype(np.uint8).reshape(-1, size, size, 3)
    return frames, np.repeat(np.arange(worlds), per_world)


def test_world_folds_keep_every_world_in_one_fold() -> None:
    groups = np.repeat(np.array([3, 1, 4, 1, 5, 9, 2, 6]), 5)
    fold = world_folds(groups, 2)
    for g in np.unique(groups):
        assert len(set(fold[groups == g])) == 1
    assert sorted(np.bincount(fold)) == [15, 25]  # 7 distinct worlds: 3 and 4 of them
    with pytest.raises(ValueError, match="folds"):
        world_folds(np.zeros(4, int), 2)


def test_c2st_judges_every_world_with_a_classifier_that_never_saw_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = bench_measures.train_classifier

    def spy(x, y, cfg):
        seen.append(len(x))
        return real(x, y, cfg)

    monkeypatch.setattr(bench_measures, "train_classifier", spy)
    a, groups = textures(np.random.default_rng(9), 6, 4)
    c2st_accuracy(a, blur4(a), groups, groups, replace(TINY, epochs=1), folds=3)
    assert seen == [32, 32, 32]  # 4 of the 6 worlds, both sets, for each of 3 folds


def test_c2st_averages_its_repeats_over_consecutive_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int] = []
    real = bench_measures.train_classifier

    def spy(x, y, cfg):
        seeds.append(cfg.seed)
        return real(x, y, cfg)

    colours = np.random.default_rng(0).integers(60, 196, (6, 3))
    a, groups = textures(np.random.default_rng(1), 6, 4, base=colours)
    b, _ = textures(np.random.default_rng(2), 6, 4, base=colours)
    cfg = replace(TINY, epochs=1, seed=5)
    one = [c2st_accuracy(a, b, groups, groups, replace(cfg, seed=s), folds=3) for s in (5, 6)]
    monkeypatch.setattr(bench_measures, "train_classifier", spy)
    both = c2st_accuracy(a, b, groups, groups, replace(cfg, repeats=2), folds=3)
    assert seeds == [5, 6] * 3  # two classifiers a fold
    assert both == pytest.approx(np.mean(one))
    monkeypatch.undo()
    reads = c2st_readings(a, b, groups, groups, replace(cfg, repeats=2), folds=3)
    assert reads.tolist() == pytest.approx(one)  # each classifier's own reading, as the bench prints their spread
    with pytest.raises(ValueError, match="repeats"):
        C2STConfig(repeats=0)


def test_c2st_cannot_tell_a_distribution_from_itself() -> None:
    colours = np.random.default_rng(0).integers(60, 196, (16, 3))
    a, groups = textures(np.random.default_rng(1), 16, 12, base=colours)
    b, _ = textures(np.random.default_rng(2), 16, 12, base=colours)  # the same worlds, other draws
    acc = c2st_accuracy(a, b, groups, groups, TINY)
    assert 0.35 <= acc <= 0.65


def test_c2st_tells_a_blur_from_the_sharp_frames() -> None:
    a, groups = textures(np.random.default_rng(2), 16, 12)
    assert c2st_accuracy(a, blur4(a), groups, groups, TINY) >= 0.95


def test_c2st_refuses_mismatched_sets() -> None:
    a, groups = textures(np.random.default_rng(3), 4, 2)
    with pytest.raises(ValueError, match="one size"):
        c2st_accuracy(a, a[:, :16], groups, groups, TINY)
    with pytest.raises(ValueError, match="one group per frame"):
        c2st_accuracy(a, a, groups[:-1], groups, TINY)


def test_blur4_and_blocky_keep_the_mean_colour_and_lose_detail() -> None:
    a, _ = textures(np.random.default_rng(4), 2, 2)
    for out in (blur4(a), blocky(a)):
        assert out.shape == a.shape and out.dtype == np.uint8
        assert np.abs(out.reshape(-1, 3).astype(float).mean(0) - a.reshape(-1, 3).mean(0)).max() < 2
        assert np.abs(np.diff(out.astype(float), axis=2)).mean() < 0.5 * np.abs(np.diff(a.astype(float), axis=2)).mean()
    np.testing.assert_array_equal(blocky(a, 16)[:, :16, :16], np.broadcast_to(blocky(a, 16)[:, :1, :1], (4, 16, 16, 3)))


def test_frechet_distance_of_a_set_with_itself_is_zero_and_follows_the_formula() -> None:
    rng = np.random.default_rng(5)
    f = rng.normal(0, 1, (400, 6)) @ rng.normal(0, 1, (6, 6))
    assert abs(frechet_distance(f, f)) < 1e-6
    shift = rng.normal(0, 1, 6)
    assert frechet_distance(f, f + shift) == pytest.approx(float((shift**2).sum()), rel=1e-6)
    centred = f - f.mean(0)  # doubling: covariance x4, so tr(S + 4S - 2 * 2S) = tr(S)
    trace = float(np.trace(np.cov(centred, rowvar=False)))
    assert frechet_distance(centred, 2 * centred) == pytest.approx(trace, rel=1e-6)
    with pytest.raises(ValueError, match="feature sets"):
        frechet_distance(f, f[:, :3])


@pytest.fixture(scope="module")
def one_world() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Renderer frames of one held-out world and scene at three sets of places: a bank, held
    out frames and others (16 frames each at 64 px)."""
    world = World(7, "grassland moderate day clear summer", (64,))
    rng = np.random.default_rng(6)
    sets = []
    for _ in range(3):
        frames = []
        for _ in range(16):
            world.reset(world.random_position(rng))
            frames.append(world.render(64))
        sets.append(np.stack(frames))
    return sets[0], sets[1], sets[2]


def test_the_worlds_own_frames_are_made_of_its_patches_and_blocks_are_not(one_world) -> None:
    bank, held, other = one_world
    own = patch_distance(held, bank)
    assert 0.7 <= patch_distance(other, bank) / own <= 1.4
    assert patch_distance(blocky(other), bank) / own > 1.5
    assert patch_distance(blur4(other), bank) / own > 1.1
    assert patch_distance(bank, bank) < 1e-3  # every patch is in the bank


def test_patch_ratio_compares_the_model_with_the_renderer_at_the_same_moment(
    one_world, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("worldserve.bench.realism.PATCH_EVERY", 1)  # every frame of these short windows
    bank, held, other = one_world
    moment = Moment("60s", 30, held[None], {"world": other[None], "blocks": blocky(other)[None]})
    ratio, d_model, d_truth = patch_ratio(moment, bank[None], "world")
    assert 0.7 <= ratio <= 1.4 and len(d_model) == len(d_truth) == 1
    assert patch_ratio(moment, bank[None], "blocks")[0] > 1.5


def test_scene_net_shapes_and_labels() -> None:
    net = SceneNet((4, 8)).eval()
    frames = np.zeros((3, 32, 32, 3), np.uint8)
    assert scene_features(net, frames).shape == (3, 64)
    out = net(torch.zeros(2, 3, 64, 64))
    assert [out[a].shape[1] for a in HEADS] == [len(ATTRIBUTES[a]) for a in HEADS]
    scene = SceneAttrs(biome="snow", time="night")
    assert [ATTRIBUTES[a][i] for a, i in zip(HEADS, labels(scene), strict=True)] == [getattr(scene, a) for a in HEADS]


def test_the_committed_scene_net_names_biome_and_time_of_an_unseen_world() -> None:
    net = load_scene_net(DEFAULT_PATH, train_if_missing=False)
    world = World(3, None, (64,))
    rng = np.random.default_rng(8)
    right, total = {"biome": 0, "time": 0}, 0
    for biome in ATTRIBUTES["biome"]:
        for time_of_day in ATTRIBUTES["time"]:
            scene = SceneAttrs(biome=biome, time=time_of_day)
            world.set_scene(scene)
            world.reset(world.random_position(rng))
            with torch.no_grad():
                out = net(torch.from_numpy(world.render(64)).permute(2, 0, 1)[None].float() / 127.5 - 1)
            for a in right:
                right[a] += int(ATTRIBUTES[a][int(out[a].argmax())] == getattr(scene, a))
            total += 1
    assert right["biome"] / total >= 0.75 and right["time"] / total >= 0.75


def test_beside_defaults_to_the_committed_weights_for_other_weights(tmp_path: Path) -> None:
    assert beside_weights(DEFAULT_WEIGHTS, None) == []
    other = tmp_path / "new.safetensors"
    assert beside_weights(other, None) == [DEFAULT_WEIGHTS]
    assert beside_weights(other, []) == []
    assert beside_weights(other, [other, DEFAULT_WEIGHTS]) == [DEFAULT_WEIGHTS]


def test_a_tiny_run_measures_every_runner_and_writes_a_strip_per_moment(tmp_path: Path) -> None:
    cfg = tiny_config()
    runners = {"a": make_runner(tiny_config(), max_sessions=4), "b": make_runner(tiny_config(), seed=1, max_sessions=4),
               "o": OracleRunner(randomized(cfg), scene_encoder=scene_encoder_for(cfg), max_sessions=4)}
    lines: list[str] = []
    moments = (("2s", 4), ("10s", 8), ("60s", 12))
    oracles = {"o": Oracle("ground", 2)}
    res = measure(runners, 32, 4, seed=0, out=tmp_path, c2st=C2STConfig(widths=(4,), crop=16, epochs=1, repeats=1),
                  lines=lines, moments=moments, size=4, oracles=oracles)
    assert set(res) == {"a", "b", "o"}
    for r in res.values():
        assert summary_fields(r).startswith("c2st_2s=") and "c2st_blocks=" in summary_fields(r)
        assert all(np.isfinite(v) for v in r.values())
        assert r["void"] == float(min(r["c2st_control"], r["c2st_blocks"]) < 0.95)
    assert res["a"]["c2st_control"] == res["b"]["c2st_control"]  # one control a run
    for name, _ in moments:
        img = np.asarray(Image.open(tmp_path / f"realism_{name}_32.png"))
        assert img.shape == (4 * 32 * 4, 4 * 32 * 4, 3)  # renderer + three models, 4 worlds, x4
    assert any("c2st_control" in line for line in lines)
    verdict = oracle_lines(res, oracles)
    assert len(verdict) == 1 and verdict[0].startswith("oracle o ") and verdict[0][-1] in "01"


def test_every_runner_on_the_canvas_gets_a_realism_line_of_its_own() -> None:
    figures = {"c2st_2s": 0.7, "c2st_10s": 0.75, "c2st_60s": 0.8, "c2st_control": 0.98, "c2st_blocks": 1.0,
               "fd_60s": 77.1, "fd_floor": 50.7, "patch_ratio_60s": 1.7, "void": 0.0}
    res = {"default.safetensors": figures, "canvas": figures, "canvas tok:a": {**figures, "void": 1.0}}
    lines = canvas_lines(res)
    assert lines == [f"realism canvas {summary_fields(figures)}",
                     f"realism canvas tok:a {summary_fields(figures)} VOID"]
    assert canvas_lines({"default.safetensors": figures}) == []


def test_an_oracle_is_given_the_renderers_view_at_each_refresh() -> None:
    frame, ground = Oracle("frame", 4), Oracle("ground", 4)
    run = steer_worlds(32, 2, np.random.default_rng(0), (("2s", 4), ("10s", 8), ("60s", 12)), 4, (frame, ground))
    refs = run.references
    assert refs[frame.label].shape == refs[ground.label].shape == (2, 14 // 4 + 1, 32, 32, 3)
    assert not refs[frame.label][:, 0].any() and refs[frame.label][:, 1:].any()  # frame 0 is the observation
    # the renderer's frame at a refresh is in the moment's window, where the bench kept it
    at12 = run.moments[-1].truth[:, list(window(12, 4)).index(12)]
    assert np.array_equal(refs[frame.label][:, 3], at12)
    assert not np.array_equal(refs[ground.label][:, 3], at12)  # no actors, water shimmer or weather


def test_strips_go_to_runs_unless_the_docs_are_asked_for() -> None:
    ap = argparse.ArgumentParser()
    add_out_args(ap)
    assert out_dir(ap.parse_args([])) == Path("runs/quality")
    assert out_dir(ap.parse_args(["--update-docs"])) == Path("docs/quality")
    assert out_dir(ap.parse_args(["--out", "x"])) == Path("x")
    with pytest.raises(SystemExit):
        out_dir(ap.parse_args(["--out", "x", "--update-docs"]))


def test_tokenizers_beside_serve_the_same_weights_on_a_canvas_drawn_by_each(tmp_path: Path) -> None:
    """``--tokenizers``: a decoder trained on is measured beside the committed one, on the same
    compositor and bank, each under its own label."""
    from worldserve.model.default.reference.canvas.tokenizer import (
        WEIGHTS,
        GroundTokenizer,
        load_tokenizer,
        save_tokenizer,
    )

    committed = load_tokenizer(WEIGHTS)
    smooth = GroundTokenizer(replace(committed.cfg, upsample="bilinear"))
    smooth.load_state_dict(committed.state_dict())
    save_tokenizer(smooth, tmp_path / "smooth" / "export" / "tokenizer")
    runners: dict = {}
    with_canvas(runners, [DEFAULT_WEIGHTS], True, [tmp_path / "smooth" / "export" / "tokenizer"], max_sessions=2)
    try:
        assert list(runners) == ["canvas", "canvas tok:export"]
        assert runners["canvas"].ground.tokenizer.cfg.upsample == "nearest"
        assert runners["canvas tok:export"].ground.tokenizer.cfg.upsample == "bilinear"
    finally:
        for r in runners.values():
            r.ground.close()
