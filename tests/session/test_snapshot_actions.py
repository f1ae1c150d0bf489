"""A model state's action trace (the pixel-frame actions its kept frames were made with, and
its anchor's frame) round trips bit for bit, from version 5 and from an older worker's
version 4, beside a continuation or none, and is validated on load."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest

from tests.session.test_snapshot_continuation import continuation
from worldserve.session.errors import SnapshotError
from worldserve.session.plan import ActionTrace, ModelState
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import (
    MAX_ACTION_ROWS,
    VERSION,
    restore,
    snapshot,
)


def trace(rows: int = 13, mouse: int = 2) -> ActionTrace:
    rng = np.random.default_rng(3)
    return ActionTrace(
        keyboard=(rng.integers(0, 2, (rows, 4)) * np.float32(1)).astype(np.float32),
        mouse=(rng.uniform(-1, 1, (rows, mouse)) * np.float32(0.1)).astype(np.float32),
        first=37,
        anchor_frame=6,
    )


def latent_state(actions: ActionTrace | None = None, *, anchor_image: bool = True) -> ModelState:
    """A Matrix-Game-like state: latents, the anchor image in ``frames``, the trace."""
    rng = np.random.default_rng(0)
    return ModelState(
        bucket=32, frames=rng.integers(0, 256, (1 if anchor_image else 0, 32, 48, 3), dtype=np.uint8),
        sink_count=0, frame_index=12, rng=rng.integers(0, 256, 16, dtype=np.uint8), scene="",
        latents=rng.standard_normal((6, 4, 4, 6)).astype(np.float32), family="matrix-game-2",
        actions=actions if actions is not None else trace(),
    )


def session() -> Session:
    return Session.create(SessionConfig(fps=16.0, bucket=32, steps=3), scene="")[0]


@pytest.mark.parametrize("mouse", [2, 0])
def test_an_action_trace_round_trips_bit_for_bit(mouse: int) -> None:
    want = latent_state(trace(mouse=mouse))
    data = snapshot(session(), want)
    assert msgpack.unpackb(data)["version"] == VERSION
    _, got = restore(data)
    assert got.actions is not None and want.actions is not None and got.continuation is None
    assert got.actions.keyboard.dtype == np.float32 and got.actions.keyboard.tobytes() == want.actions.keyboard.tobytes()
    assert got.actions.mouse.shape == (13, mouse) and got.actions.mouse.tobytes() == want.actions.mouse.tobytes()
    assert (got.actions.first, got.actions.anchor_frame) == (37, 6)
    assert np.array_equal(got.frames, want.frames) and got.frames.shape == (1, 32, 48, 3)
    assert got.latents is not None and want.latents is not None and got.latents.tobytes() == want.latents.tobytes()
    assert got.family == "matrix-game-2" and got.frame_index == 12


def test_a_trace_travels_beside_a_continuation() -> None:
    st = latent_state()
    st.continuation = continuation(6, anchor=False)
    _, got = restore(snapshot(session(), st))
    assert got.continuation is not None and got.continuation.kv.shape[2] == 6
    assert got.actions is not None and got.actions.first == 37


def test_a_state_without_a_trace_travels_with_none() -> None:
    st = latent_state()
    st.actions = None
    st.continuation = continuation(6, anchor=False)
    data = snapshot(session(), st)
    assert msgpack.unpackb(data)["model"]["actions"] is None
    _, got = restore(data)
    assert got.actions is None and got.continuation is not None
    st.continuation = None
    data = snapshot(session(), st)
    assert restore(data)[1].actions is None and restore(data)[1].continuation is None


def _edit(fn: Callable[[dict[str, Any]], None]) -> bytes:
    doc = msgpack.unpackb(snapshot(session(), latent_state()), raw=False)
    fn(doc["model"])
    return msgpack.packb(doc, use_bin_type=True)


def _array(arr: np.ndarray) -> dict[str, object]:
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.tobytes()}


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda m: m["actions"].__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("keyboard", _array(np.zeros((12, 4), np.float32))), r"actions\.mouse: expected \(12, 0\.\.64\)"),
        (_set("keyboard", _array(np.zeros((13, 0), np.float32))), r"actions\.keyboard: expected"),
        (_set("keyboard", _array(np.zeros((MAX_ACTION_ROWS + 1, 4), np.float32))), r"actions\.keyboard: expected"),
        (_set("keyboard", _array(np.zeros((13, 4), np.float64))), r"actions\.keyboard\.dtype"),
        (_set("mouse", _array(np.full((13, 2), np.inf, np.float32))), r"actions\.mouse: not all finite"),
        (_set("mouse", _array(np.zeros(13, np.float32))), r"actions\.mouse\.shape: expected 2"),
        (_set("first", -1), r"actions\.first"),
        (_set("anchor_frame", 13), r"actions\.anchor_frame: expected an int in \[0, 12\]"),
        (lambda m: m["actions"].pop("anchor_frame"), r"actions: missing keys \['anchor_frame'\]"),
        (lambda m: m.__setitem__("actions", b"\x80\x04."), r"actions: expected a map"),
        (lambda m: m.__setitem__("frames", _array(np.zeros((2, 32, 48, 3), np.uint8))), r"frames: expected \(0 or 1"),
    ],
)
def test_a_bad_action_trace_is_a_snapshot_error_naming_the_field(
    edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    with pytest.raises(SnapshotError, match=message):
        restore(_edit(edit))
