"""A model state's continuation (its cache and what shapes the next frames besides) round
trips bit for bit, from version 5 and from an older worker's version 3, and is validated on
load."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest

from tests.session.fakes import model_state
from worldserve.session.errors import SnapshotError
from worldserve.session.plan import Continuation, ModelState
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import VERSION, restore, snapshot


def continuation(frames: int, *, anchor: bool = True) -> Continuation:
    rng = np.random.default_rng(1)
    # values no rounding keeps: any widening or narrowing on the way shows
    kv = rng.standard_normal((2, 2, frames, 4, 2, 8)).astype(np.float32) * np.float32(1 / 3)
    prev = rng.uniform(-1, 1, (3, 8, 8)).astype(np.float32)
    return Continuation(
        kv=kv,
        prev=prev,
        anchor=rng.uniform(-1, 1, (3, 8, 8)).astype(np.float32) if anchor else None,
        anchor_offset=np.array([0.125, -2.7182817], np.float32) if anchor else None,
        anchor_wait=0 if anchor else 5,
        anchor_age=11,
    )


def continued_state(frames: int = 3, *, anchor: bool = True) -> ModelState:
    st = model_state(bucket=8, frames=frames)
    st.continuation = continuation(frames, anchor=anchor)
    return st


def session() -> Session:
    return Session.create(SessionConfig(fps=24.0, bucket=8, steps=4), scene="s")[0]


@pytest.mark.parametrize("anchor", [True, False])
def test_a_continuation_round_trips_bit_for_bit(anchor: bool) -> None:
    want = continued_state(anchor=anchor)
    data = snapshot(session(), want)
    assert msgpack.unpackb(data)["version"] == VERSION
    _, got = restore(data)
    assert got.continuation is not None and want.continuation is not None
    a, b = got.continuation, want.continuation
    assert a.kv.dtype == np.float32 and a.kv.tobytes() == b.kv.tobytes()
    assert a.prev.tobytes() == b.prev.tobytes()
    if anchor:
        assert a.anchor is not None and b.anchor is not None and a.anchor.tobytes() == b.anchor.tobytes()
        assert a.anchor_offset is not None and b.anchor_offset is not None
        assert a.anchor_offset.tobytes() == b.anchor_offset.tobytes()
    else:
        assert a.anchor is None and a.anchor_offset is None
    assert (a.anchor_wait, a.anchor_age) == (b.anchor_wait, b.anchor_age)
    assert np.array_equal(got.frames, want.frames) and got.frame_index == want.frame_index
    assert got.family == "default" and got.latents is None


def test_a_state_without_continuation_travels_with_none() -> None:
    data = snapshot(session(), model_state(bucket=8))
    assert msgpack.unpackb(data)["model"]["continuation"] is None
    assert restore(data)[1].continuation is None


def test_a_latent_state_carries_a_continuation_beside_its_latents() -> None:
    rng = np.random.default_rng(0)
    st = ModelState(
        bucket=8, frames=np.zeros((0, 8, 12, 3), np.uint8), sink_count=1, frame_index=4,
        rng=rng.integers(0, 256, 16, dtype=np.uint8), scene="s",
        latents=rng.standard_normal((4, 4, 2, 3)).astype(np.float32), family="wan-causal",
        continuation=continuation(4, anchor=False),
    )
    _, got = restore(snapshot(session(), st))
    assert got.family == "wan-causal" and got.latents is not None and got.continuation is not None
    assert got.continuation.kv.shape[2] == 4


def _edit(fn: Callable[[dict[str, Any]], None]) -> bytes:
    doc = msgpack.unpackb(snapshot(session(), continued_state()), raw=False)
    fn(doc["model"]["continuation"])
    return msgpack.packb(doc, use_bin_type=True)


def _array(arr: np.ndarray) -> dict[str, object]:
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.tobytes()}


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("kv", _array(np.zeros((2, 2, 4, 4, 2, 8), np.float32))), r"continuation\.kv: expected \(2, L, 3"),
        (_set("kv", _array(np.zeros((2, 2, 3, 4, 2, 8), np.float16))), r"continuation\.kv\.dtype"),
        (_set("prev", _array(np.full((3, 8, 8), np.nan, np.float32))), r"continuation\.prev: not all finite"),
        (_set("anchor", _array(np.zeros((3, 4, 4), np.float32))), r"continuation\.anchor: expected prev's shape"),
        (_set("anchor_offset", _array(np.zeros(3, np.float32))), r"continuation\.anchor_offset"),
        (_set("anchor_wait", -1), r"continuation\.anchor_wait"),
        (lambda c: c.pop("anchor_age"), r"continuation: missing keys \['anchor_age'\]"),
        (_set("pickle", b"\x80\x04."), r"unexpected keys"),
    ],
)
def test_a_bad_continuation_is_a_snapshot_error_naming_the_field(
    edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    with pytest.raises(SnapshotError, match=message):
        restore(_edit(edit))


def test_a_snapshot_without_its_family_is_a_snapshot_error() -> None:
    data = snapshot(session(), continued_state())
    doc = msgpack.unpackb(data, raw=False)
    del doc["model"]["family"]
    with pytest.raises(SnapshotError, match=r"model: missing keys \[.family.\]"):
        restore(msgpack.packb(doc, use_bin_type=True))
