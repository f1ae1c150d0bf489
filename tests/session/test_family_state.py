"""A model family's own state travels in a snapshot bit for bit, and session/ checks only its
envelope: names, dtypes, ranks, finite floats and size; the family checks what it holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest

from tests.session.fakes import model_state
from worldserve.session.errors import SnapshotError
from worldserve.session.family_state import (
    MAX_ENTRIES,
    MAX_STATE_BYTES,
    check_envelope,
    entry,
    scalar,
)
from worldserve.session.plan import ModelState
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import VERSION, restore, snapshot


def family_state() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    # values no rounding keeps: any widening or narrowing on the way shows
    return {
        "kv": rng.standard_normal((2, 2, 3, 4, 2, 8)).astype(np.float32) * np.float32(1 / 3),
        "prev": rng.uniform(-1, 1, (3, 8, 8)).astype(np.float32),
        "codes": rng.integers(0, 0xFFFF, (2, 16, 16), dtype=np.uint16),
        "position": np.array([0.1, 1e-300], np.float64),
        "age": np.asarray(11, np.int64),
    }


def session() -> Session:
    return Session.create(SessionConfig(fps=24.0, bucket=8, steps=4), scene="s")[0]


def kept_state() -> ModelState:
    st = model_state(bucket=8, frames=3)
    st.family_state = family_state()
    return st


def test_a_family_state_round_trips_bit_for_bit() -> None:
    want = kept_state()
    data = snapshot(session(), want)
    assert msgpack.unpackb(data)["version"] == VERSION
    _, got = restore(data)
    assert set(got.family_state) == set(want.family_state)
    for name, arr in want.family_state.items():
        back = got.family_state[name]
        assert back.dtype == arr.dtype and back.shape == arr.shape and back.tobytes() == arr.tobytes(), name
    assert np.array_equal(got.frames, want.frames) and got.family == "default"


def test_a_state_without_family_state_travels_with_an_empty_map() -> None:
    data = snapshot(session(), model_state(bucket=8))
    assert msgpack.unpackb(data)["model"]["family_state"] == {}
    assert restore(data)[1].family_state == {}


def test_a_latent_state_carries_its_family_state_beside_its_latents() -> None:
    rng = np.random.default_rng(0)
    st = ModelState(
        bucket=8, frames=np.zeros((0, 8, 12, 3), np.uint8), sink_count=1, frame_index=4,
        rng=rng.integers(0, 256, 16, dtype=np.uint8), scene="s",
        latents=rng.standard_normal((4, 4, 2, 3)).astype(np.float32), family="wan-causal",
        family_state={"action_keyboard": np.eye(4, dtype=np.float32)},
    )
    _, got = restore(snapshot(session(), st))
    assert got.latents is not None and np.array_equal(got.family_state["action_keyboard"], np.eye(4))


def _edit(fn: Callable[[dict[str, Any]], None]) -> bytes:
    doc = msgpack.unpackb(snapshot(session(), kept_state()), raw=False)
    fn(doc["model"]["family_state"])
    return msgpack.packb(doc, use_bin_type=True)


def _array(arr: np.ndarray, dtype: str | None = None) -> dict[str, object]:
    return {"dtype": dtype or arr.dtype.name, "shape": list(arr.shape), "data": arr.tobytes()}


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("prev", _array(np.full((3, 8, 8), np.nan, np.float32))), r"family_state\.prev: not all finite"),
        (_set("Bad-Name", _array(np.zeros(2, np.float32))), r"entry name 'Bad-Name'"),
        (_set("deep", _array(np.zeros((1,) * 7, np.float32))), r"family_state\.deep\.shape: expected at most 6"),
        (_set("obj", _array(np.zeros(2, np.float32), "object")), r"family_state\.obj\.dtype"),
        (_set("pickle", b"\x80\x04."), r"family_state\.pickle: expected a map"),
        (_set("short", {"dtype": "float32", "shape": [4], "data": b"\0" * 8}), r"needs 16 bytes"),
    ],
)
def test_a_bad_family_state_is_a_snapshot_error_naming_the_entry(
    edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    with pytest.raises(SnapshotError, match=message):
        restore(_edit(edit))


def test_a_family_state_of_too_many_entries_or_bytes_is_refused_both_ways() -> None:
    many = {f"e{i}": np.zeros(1, np.float32) for i in range(MAX_ENTRIES + 1)}
    with pytest.raises(ValueError, match=f"over {MAX_ENTRIES}"):
        check_envelope(many)
    big = {"kv": np.zeros(MAX_STATE_BYTES // 4 + 1, np.float32)}
    with pytest.raises(ValueError, match=f"over {MAX_STATE_BYTES}"):
        check_envelope(big)
    st = kept_state()
    st.family_state = many
    with pytest.raises(SnapshotError, match=f"over {MAX_ENTRIES}"):
        snapshot(session(), st)


def test_a_snapshot_without_its_family_state_is_a_snapshot_error() -> None:
    doc = msgpack.unpackb(snapshot(session(), kept_state()), raw=False)
    del doc["model"]["family_state"]
    with pytest.raises(SnapshotError, match=r"model: missing keys \[.family_state.\]"):
        restore(msgpack.packb(doc, use_bin_type=True))


def test_a_family_reads_its_entries_by_name_dtype_and_shape() -> None:
    fs = family_state()
    assert entry(fs, "prev", "float32", (3, None, None)) is fs["prev"]
    assert entry(fs, "absent", "float32", (2,), optional=True) is None
    assert scalar(fs, "age", 0, 20) == 11
    with pytest.raises(ValueError, match=r"mine\.prev: expected float32 \(3, 4, 4\), got float32 \(3, 8, 8\)"):
        entry(fs, "prev", "float32", (3, 4, 4), family="mine")
    with pytest.raises(ValueError, match=r"family_state\.absent: missing"):
        entry(fs, "absent", "float32", (2,))
    with pytest.raises(ValueError, match=r"family_state\.age: expected an int in \[0, 5\], got 11"):
        scalar(fs, "age", 0, 5)
