"""The live state of what moves (``model/default/reference/live/``) and the network's state
channels (``ModelConfig.state_channels``): sampled from the seed on its own ground, moving,
exact through a family state, bounded; and weights without it serve as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model.conftest import randomized, tiny_config
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.reference.canvas.canvas import TILE, TILE_UNITS, Canvas
from worldserve.model.default.reference.live.bank import SNIPPET, LiveBank
from worldserve.model.default.reference.live.channels import ANIMAL, BOAT, CLOUD, STATE_CHANNELS
from worldserve.model.default.reference.live.state import (
    MAX_ACTORS,
    LiveState,
    channels,
    from_entries,
    spawn_ready,
    step,
    to_entries,
)
from worldserve.model.default.weights import (
    WeightsError,
    load_model,
    load_state,
    save_live_parts,
    save_model,
)
from worldserve.session.family_state import check_envelope
from worldserve.training.checkpoint import NEW_MODULES

LAND, WATER = 3, 7  # the test bank's ground codes
MAP = 1024


def _bank() -> LiveBank:
    rng = np.random.default_rng(0)
    land, water = np.zeros(1024, np.float32), np.zeros(1024, np.float32)
    land[LAND], water[WATER] = 1.0, 1.0
    speed = (rng.uniform(0.0, 0.5, (16, SNIPPET)).astype(np.float32),
             rng.uniform(0.35, 0.8, (16, SNIPPET)).astype(np.float32))
    turn = tuple(rng.normal(0, 0.06, (16, SNIPPET)).astype(np.float32) for _ in range(2))
    return LiveBank(
        code_land=land, code_water=water, herd_rate=4e-4, boat_rate=1e-3,
        herd_sizes=np.array([3, 5, 8], np.int16), herd_spread=4.0, speed=speed, turn=turn,  # type: ignore[arg-type]
        clouds=rng.integers(0, 256, (2, 256, 256)).astype(np.uint8),
        fog=rng.integers(0, 256, (2, 256, 256)).astype(np.uint8),
        winds=np.array([[0.2, -0.1], [0.0, 0.3]], np.float32), cloud_threshold={"cloud": 0.4}, cloud_soft=0.14,
        fog_map=(0.42, 0.6, 0.1, 0.85),
    )


def _canvas() -> Canvas:
    """Land in the west half of every tile, water in the east, 4 x 4 tiles around (0, 0)."""
    canvas = Canvas(MAP, MAP / 2)
    codes = np.full((TILE, TILE), LAND, np.uint16)
    codes[:, TILE // 2 :] = WATER
    for ty in range(4):
        for tx in range(4):
            canvas.write((ty, tx), codes)
    return canvas


def _run(st: LiveState, bank: LiveBank, canvas: Canvas, frames: int) -> None:
    top = (64.0, 64.0)
    for _ in range(frames):
        spawn_ready(st, bank, canvas, top)
        step(st, bank, canvas, (top[0] + 32, top[1] + 32))


def _on(kind: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Whether each actor stands on its ground in ``_canvas``: land west, water east in a tile."""
    east = (pos[:, 1] % TILE_UNITS) >= TILE_UNITS / 2
    return np.where(kind == BOAT, east, ~east)


def test_the_live_state_is_the_seed_s_and_stands_on_its_own_ground() -> None:
    bank, canvas = _bank(), _canvas()
    a, b, c = LiveState(seed=5), LiveState(seed=5), LiveState(seed=6)
    for st in (a, b, c):
        _run(st, bank, canvas, 1)
    assert len(a) > 0 and {ANIMAL, BOAT} <= set(a.kind.tolist())
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("kind", "pos", "heading", "snippet"))
    assert len(a) != len(c) or not np.array_equal(a.pos, c.pos)
    assert _on(a.kind, a.pos).all()
    assert len(a.spawned) == 1  # the view at (64, 64) overlaps one whole tile: its actors, once
    before = len(a)
    _run(a, bank, canvas, 1)
    assert len(a) == before


def test_actors_move_and_keep_to_their_ground() -> None:
    bank, canvas = _bank(), _canvas()
    st = LiveState(seed=1)
    _run(st, bank, canvas, 1)
    start = st.pos.copy()
    _run(st, bank, canvas, 3 * SNIPPET)  # through snippet changes
    moved = np.hypot(*(st.pos - start).T)
    assert np.median(moved[st.kind == BOAT]) > 2.0 and (st.draws > 0).all()
    assert _on(st.kind, st.pos).all()


def test_an_exported_state_goes_on_exactly_as_the_undisturbed_one() -> None:
    bank, canvas = _bank(), _canvas()
    st = LiveState(seed=9)
    _run(st, bank, canvas, 50)
    entries = to_entries(st)
    check_envelope(entries)
    back = from_entries({k: v.copy() for k, v in entries.items()}, bank)
    assert back is not None
    _run(st, bank, canvas, 150)
    _run(back, bank, canvas, 150)
    for f in ("kind", "variant", "pos", "heading", "snippet", "t", "draws", "uid", "spawned"):
        assert np.array_equal(getattr(st, f), getattr(back, f)), f
    assert back.frame == st.frame
    a = channels(st, bank, "cloud", (64.0, 64.0), 64, MAP)
    assert np.array_equal(a, channels(back, bank, "cloud", (64.0, 64.0), 64, MAP))
    assert a.shape == (STATE_CHANNELS, 64, 64) and 0 < a[CLOUD].mean() < 1


def test_a_malformed_live_entry_is_refused_by_name() -> None:
    bank, canvas = _bank(), _canvas()
    st = LiveState(seed=2)
    _run(st, bank, canvas, 1)
    entries = to_entries(st)
    entries["live_t"] = np.full_like(entries["live_t"], SNIPPET)
    with pytest.raises(ValueError, match="live_"):
        from_entries(entries, bank)
    assert from_entries({}, bank) is None


def test_the_live_state_is_bounded() -> None:
    bank = _bank()
    dense = LiveBank(**{**{f: getattr(bank, f) for f in bank.__slots__}, "herd_rate": 0.05})  # type: ignore[arg-type]
    canvas = Canvas(MAP, MAP / 2)
    codes = np.full((TILE, TILE), LAND, np.uint16)
    st = LiveState(seed=3)
    for ty in range(MAP // TILE_UNITS):
        for tx in range(MAP // TILE_UNITS):
            canvas.write((ty, tx), codes)
            spawn_ready(st, dense, canvas, (ty * TILE_UNITS, tx * TILE_UNITS))
    assert 0 < len(st) <= MAX_ACTORS and st.nbytes <= MAX_ACTORS * 64 + 16 * len(st.spawned)


def _sequence(cfg, seed: int = 0) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    b, n, h = 2, 3, cfg.buckets[0]
    x = torch.randn(b, n, cfg.channels, h, h, generator=g)
    prev = torch.randn(b, n, cfg.reference_channels, h, h, generator=g)
    return (x, prev, torch.rand(b, n, generator=g), torch.randn(b, n, cfg.action_dim, generator=g),
            torch.randn(b, cfg.scene_dim, generator=g), torch.arange(n), torch.zeros(n, dtype=torch.bool))


@pytest.mark.parametrize("basis", [0, 4])
def test_weights_without_state_channels_serve_as_before_with_the_state_s_channels_at_zero(basis: int) -> None:
    base_cfg = tiny_config()
    live_cfg = tiny_config(state_channels=STATE_CHANNELS, state_basis=basis)
    base = randomized(base_cfg)
    live = WorldModel(live_cfg).eval()
    load_state(live, base.state_dict(), "base", allow_missing=NEW_MODULES)  # the new stem and head start at zero
    x, prev, *rest = _sequence(base_cfg)
    want, _ = base.forward_sequence(x, prev, *rest)
    state = torch.rand(*prev.shape[:2], STATE_CHANNELS, *prev.shape[3:])
    got, _ = live.forward_sequence(x, torch.cat((prev, state), 2), *rest)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # zero-initialised: read, not yet drawn
    with torch.no_grad():  # trained state weights with no state at all: still the same frames
        for name, p in live.named_parameters():
            if name.startswith(("state_stems.", "state_heads.", "state_basis")):
                p.normal_(0.0, 0.2)
    got, _ = live.forward_sequence(x, torch.cat((prev, torch.zeros_like(state)), 2), *rest)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    drawn, _ = live.forward_sequence(x, torch.cat((prev, state), 2), *rest)
    assert not torch.allclose(drawn, want)


def test_a_restored_live_session_makes_exactly_the_frames_and_the_state_of_the_undisturbed_one() -> None:
    from tests.model.conftest import key_action, make_runner, run_chunks
    from worldserve.model.default.reference.canvas.ground import GroundPainter
    from worldserve.model.default.reference.live.state import from_entries as live_entries
    from worldserve.session.plan import SessionSpec, StepPlan
    from worldserve.session.session import Session, SessionConfig
    from worldserve.session.snapshot import restore, snapshot

    painter, bank = GroundPainter.load(torch.device("cpu")), LiveBank.load()
    cfg = tiny_config(state_channels=STATE_CHANNELS)
    scene = "a grassy village by a lake, cloudy"
    try:
        src = make_runner(cfg, ground=painter, live=bank)
        src.execute(StepPlan(new_sessions=[SessionSpec("s", 64, 5, scene)]))
        run_chunks(src, 0, [key_action(0)] * 6 + [key_action(3)] * 4)
        state = src.export_state("s")
        session = Session.create(SessionConfig(fps=24.0, bucket=64, steps=2), scene=scene)[0]
        state = restore(snapshot(session, state))[1]  # through the snapshot's bytes
        assert live_entries(state.family_state, bank) is not None
        dst = make_runner(cfg, ground=painter, live=bank)
        dst.execute(StepPlan(new_sessions=[SessionSpec("s", 64, 5, scene, restore=state)]))
        later = [key_action(1)] * 3 + [key_action(2)] * 5
        a, b = run_chunks(src, 10, later), run_chunks(dst, 10, later)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        sa, sb = src.sessions["s"].ref.live, dst.sessions["s"].ref.live
        assert sa.frame == sb.frame == 18 and np.array_equal(sa.pos, sb.pos) and len(sa) > 0
    finally:
        painter.close()


def test_a_live_state_needs_a_canvas_and_weights_that_read_it() -> None:
    from tests.model.conftest import make_runner

    with pytest.raises(ValueError, match="live state"):
        make_runner(tiny_config(), live=_bank())


def test_live_parts_lay_on_base_weights_and_refuse_what_does_not_fit(tmp_path: Path) -> None:
    base = randomized(tiny_config())
    save_model(base, tmp_path / "base")
    live = WorldModel(tiny_config(state_channels=STATE_CHANNELS, state_basis=4))
    load_state(live, base.state_dict(), "base", allow_missing=NEW_MODULES)
    with torch.no_grad():
        for name, p in live.named_parameters():
            if name.startswith(("state_stems.", "state_heads.", "state_basis")):
                p.normal_(0.0, 0.1)
    parts = save_live_parts(live, tmp_path / "live")
    assert parts.stat().st_size < (tmp_path / "base.safetensors").stat().st_size  # the parts alone
    laid = load_model(tmp_path / "base", live_parts=parts)
    assert laid.cfg.state_basis == 4
    for (name, p), q in zip(laid.state_dict().items(), live.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(WeightsError, match="of its own"):  # weights that have a live state already
        load_model(save_model(live, tmp_path / "whole"), live_parts=parts)
    (tmp_path / "live.json").write_text('{"state_channels": 14, "state_basis": 2}')
    with pytest.raises(WeightsError):  # parts of another shape
        load_model(tmp_path / "base", live_parts=parts)


def test_the_committed_live_parts_serve_the_default_traced_as_untraced() -> None:
    from tests.model.conftest import key_action, run_chunks
    from worldserve.model.default.runner import ModelRunner
    from worldserve.session.plan import SessionSpec, StepPlan

    scene = "a grassy village by a lake, cloudy"
    frames = {}
    for trace in (False, True):  # the server runs the default's chunks as TorchScript traces on the CPU
        runner = ModelRunner.from_pretrained(canvas=True, canvas_live=True, max_sessions=1, threads=1, trace=trace)
        try:
            assert runner.cfg.state_channels == STATE_CHANNELS and runner.cfg.state_basis > 0
            runner.execute(StepPlan(new_sessions=[SessionSpec("s", 64, 11, scene)]))
            frames[trace] = run_chunks(runner, 0, [key_action(0)] * 4)
            assert len(runner.sessions["s"].ref.live) > 0
        finally:
            assert runner.ground is not None
            runner.ground.close()
    for a, b in zip(frames[False], frames[True], strict=True):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 2
