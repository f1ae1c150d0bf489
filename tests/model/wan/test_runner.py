"""The Wan causal runner at a tiny random size, loaded through ``--model wan-causal --weights DIR``'s
path (model/registry.py): frame counts and sizes, batching, prompt re-cache, snapshots."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.model.wan.tiny_dir import HEIGHT, WIDTH, load_tiny
from worldserve.cli.main import main as cli_main
from worldserve.model.registry import LoadOptions, check, load
from worldserve.model.wan.runner import WanRunner
from worldserve.session.options import RunnerInfo
from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    ChunkWork,
    SessionSpec,
    SessionUpdate,
    StepPlan,
)
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import restore, snapshot

BUCKET = HEIGHT


def open_(runner: WanRunner, *sids: str, prompt: str = "a red fox runs through snowy woods") -> None:
    out = runner.execute(StepPlan(new_sessions=[SessionSpec(s, BUCKET, seed=i + 1, scene=prompt)
                                                for i, s in enumerate(sids)]))
    assert not out.errors


def step(runner: WanRunner, groups: list[list[tuple[str, int]]], steps: int = 4) -> dict[str, np.ndarray]:
    """One plan with a batch per group of (session, block); the frames by session."""
    act = np.zeros((runner.frames_per_chunk, ACTION_DIM), np.float32)
    plan = StepPlan(batches=[Batch(BUCKET, steps, [ChunkWork(s, b, act) for s, b in g]) for g in groups])
    out = runner.execute(plan)
    assert not out.errors, out.errors
    return {r.session_id: r.frames for r in out.results}


def rollout(runner: WanRunner, sid: str, blocks: range) -> list[np.ndarray]:
    return [step(runner, [[(sid, b)]])[sid] for b in blocks]


def test_blocks_hold_the_first_chunk_s_frames_then_the_steady_count_at_the_frame_size(wan_dir: Path) -> None:
    runner = load_tiny("wan-causal", wan_dir)
    info = RunnerInfo.of(runner, (1,))
    assert (info.first_chunk_frames, info.frames_per_chunk) == (5, 8)  # 2 latent frames: 1 + 4, then 8
    assert info.frame_size(BUCKET) == (HEIGHT, WIDTH) and info.controls == ("prompt",)
    open_(runner, "s")
    frames = rollout(runner, "s", range(4))
    assert [f.shape for f in frames] == [(5, HEIGHT, WIDTH, 3)] + [(8, HEIGHT, WIDTH, 3)] * 3
    assert all(f.dtype == np.uint8 and f.std() > 1 for f in frames)  # pictures, not a flat fill
    assert runner.sessions["s"].frame_index == 8


def test_two_sessions_batched_make_the_frames_each_makes_alone(wan_dir: Path) -> None:
    together, alone = load_tiny("wan-causal", wan_dir), load_tiny("wan-causal", wan_dir)
    open_(together, "a", "b")
    open_(alone, "a", "b")
    for block in range(4):  # past the window (1 sink + 4): the cache has rolled
        both = step(together, [[("a", block), ("b", block)]])
        single = step(alone, [[("a", block)], [("b", block)]])
        for sid in "ab":
            diff = np.abs(both[sid].astype(int) - single[sid].astype(int))
            assert diff.max() <= 1, (sid, block, diff.max())  # fp32 sums in another order
    assert not np.array_equal(both["a"], both["b"])  # their own seeds


def test_only_a_step_list_the_checkpoint_was_trained_for_is_served(wan_dir: Path) -> None:
    runner = load_tiny("wan-causal", wan_dir)
    full = runner.cfg.step_timesteps
    assert runner.schedule(4) == full and runner.capabilities.schedules == (full,)
    assert RunnerInfo.of(runner, (1,)).step_counts == (4,)  # the ladder's step rung is left out
    with pytest.raises(ValueError, match="steps 2: the recipe is trained for 4 steps only"):
        runner.schedule(2)  # no subset of the four: the student never ran one
    open_(runner, "s")
    act = np.zeros((runner.frames_per_chunk, ACTION_DIM), np.float32)
    out = runner.execute(StepPlan(batches=[Batch(BUCKET, 2, [ChunkWork("s", 0, act)])]))
    assert "trained for 4 steps only" in out.errors["s"] and not out.results


def test_a_fewer_step_list_named_in_the_config_is_served_as_listed(wan_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "w"
    shutil.copytree(wan_dir, d)
    path = d / "transformer" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "fewer_steps": [[1000, 600, 0]]}))
    runner = load_tiny("wan-causal", d)
    assert runner.schedule(2) == (1000.0, runner.cfg.warp(600.0))  # the list as trained, warped
    assert RunnerInfo.of(runner, (1,)).step_counts == (4, 2)
    assert [t.steps for t in runner.warmup((1,))] == [2, 4]
    open_(runner, "s")
    assert step(runner, [[("s", 0)]], steps=2)["s"].shape == (5, HEIGHT, WIDTH, 3)


def test_a_prompt_change_recaches_the_window_under_the_new_prompt(wan_dir: Path) -> None:
    changed, kept = load_tiny("wan-causal", wan_dir), load_tiny("wan-causal", wan_dir)
    for r in (changed, kept):
        open_(r, "s")
        rollout(r, "s", range(3))
    pool, slot = changed.pools[BUCKET], changed.sessions["s"].slot
    ids_before, _ = pool.held(slot)
    k_before = pool.k[:, slot].clone()
    calls = changed.text.encoder_calls
    out = changed.execute(StepPlan(updates=[SessionUpdate("s", scene="a city street at night with neon lights")]))
    assert not out.errors
    ids_after, _ = pool.held(slot)
    assert ids_after.tolist() == ids_before.tolist()  # the same frames, re-committed
    assert not pool.k[:, slot].allclose(k_before)  # under the new prompt's cross-attention
    assert changed.text.encoder_calls == calls + 1
    # a prompt seen before costs no encoder pass
    changed.execute(StepPlan(updates=[SessionUpdate("s", scene="a red fox runs through snowy woods")]))
    changed.execute(StepPlan(updates=[SessionUpdate("s", scene="a city street at night with neon lights")]))
    assert changed.text.encoder_calls == calls + 1
    a, b = step(changed, [[("s", 3)]])["s"], step(kept, [[("s", 3)]])["s"]
    assert a.shape == b.shape and np.abs(a.astype(int) - b.astype(int)).mean() > 1


def snapshot_round_trip(runner: WanRunner, sid: str) -> object:
    """The session's model state through a real snapshot (msgpack, version 5) and back."""
    session, _ = Session.create(SessionConfig(fps=16.0, bucket=BUCKET, steps=4, seed=1), scene="x")
    data = snapshot(session, runner.export_state(sid))
    _, state = restore(data)
    return state


def test_restore_on_a_fresh_runner_continues_exactly_while_the_cache_holds_every_frame(wan_dir: Path) -> None:
    a, b = load_tiny("wan-causal", wan_dir), load_tiny("wan-causal", wan_dir)
    open_(a, "s")
    rollout(a, "s", range(2))  # 4 latent frames: 1 sink + 3, nothing dropped yet
    state = snapshot_round_trip(a, "s")
    assert state.family == "wan-causal" and state.latents.shape == (4, 4, 4, 6) and state.sink_count == 1
    b.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, seed=99, scene=state.scene, restore=state)]))
    for block in (2, 3, 4):
        fa, fb = step(a, [[("s", block)]])["s"], step(b, [[("s", block)]])["s"]
        assert fa.shape == fb.shape == (8, HEIGHT, WIDTH, 3)  # the VAE stream goes on, not from its start
        assert np.abs(fa.astype(int) - fb.astype(int)).max() <= 1, block


def test_restore_after_the_window_rolled_goes_on_close_to_the_undisturbed_session(wan_dir: Path) -> None:
    a, b = load_tiny("wan-causal", wan_dir), load_tiny("wan-causal", wan_dir)
    open_(a, "s")
    rollout(a, "s", range(6))  # 12 latent frames: the window has rolled twice
    state = snapshot_round_trip(a, "s")
    assert state.latents.shape[0] == 12  # sinks + every later frame (the VAE's context)
    b.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, seed=99, scene=state.scene, restore=state)]))
    assert (b.pools[BUCKET].held(b.sessions["s"].slot)[0].tolist()
            == a.pools[BUCKET].held(a.sessions["s"].slot)[0].tolist())
    fa, fb = step(a, [[("s", 6)]])["s"], step(b, [[("s", 6)]])["s"]
    other = load_tiny("wan-causal", wan_dir)
    open_(other, "s")
    rollout(other, "s", range(6))
    fresh = step(other, [[("s", 6)]])["s"]  # same seed and history: what undisturbed looks like
    assert np.array_equal(fa, fresh)
    # only the deep-layer keys/values of frames whose context left the window differ
    assert np.abs(fa.astype(int) - fb.astype(int)).mean() < 8


def test_errors_are_per_session(wan_dir: Path) -> None:
    runner = load_tiny("wan-causal", wan_dir)
    open_(runner, "good")
    act = np.zeros((runner.frames_per_chunk, ACTION_DIM), np.float32)
    out = runner.execute(StepPlan(
        new_sessions=[SessionSpec("big", 64, seed=0, scene="")],
        batches=[Batch(BUCKET, 4, [ChunkWork("good", 0, act), ChunkWork("ghost", 0, act)])],
    ))
    assert "ghost" in out.errors["ghost"] and "bucket 64" in out.errors["big"]
    assert [r.session_id for r in out.results] == ["good"]


def test_a_snapshot_of_another_family_is_refused(wan_dir: Path) -> None:
    runner = load_tiny("wan-causal", wan_dir)
    open_(runner, "s")
    state = runner.export_state("s")
    state.family = "default"
    out = runner.execute(StepPlan(new_sessions=[SessionSpec("t", BUCKET, seed=0, scene="", restore=state)]))
    assert "family 'default'" in out.errors["t"]


def test_a_missing_file_is_an_error_naming_it(wan_dir: Path, tmp_path: Path) -> None:
    for part in ("vae/diffusion_pytorch_model.safetensors", "tokenizer/tokenizer_config.json",
                 "transformer/config.json", "text_encoder/model.safetensors"):
        d = tmp_path / part.replace("/", "_")
        shutil.copytree(wan_dir, d)
        (d / part).unlink()
        with pytest.raises(FileNotFoundError, match=str(d / part)):
            check("wan-causal", d)
        with pytest.raises(FileNotFoundError, match=str(d / part)):
            load("wan-causal", LoadOptions(weights=d))


def test_a_mismatched_config_names_the_file_the_key_and_the_expected_value(wan_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "w"
    shutil.copytree(wan_dir, d)
    cfg_file = d / "text_encoder" / "config.json"
    raw = json.loads(cfg_file.read_text())
    raw["d_model"] = 40
    cfg_file.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"text_encoder/config.json: d_model is 40, expected 24"):
        check("wan-causal", d)


def test_convert_writes_safetensors_that_serve_the_same_frames(wan_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "w"
    shutil.copytree(wan_dir, d)
    pt = d / "transformer" / "model.pt"
    cli_main(["convert", str(pt), str(d / "transformer" / "model.safetensors")])
    pt.unlink()
    runners = [load_tiny("wan-causal", wan_dir), load_tiny("wan-causal", d)]
    frames = []
    for r in runners:
        open_(r, "s")
        frames.append(rollout(r, "s", range(2)))
    assert all(np.array_equal(x, y) for x, y in zip(*frames, strict=True))
