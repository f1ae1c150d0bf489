"""Fuzzed, truncated and mutated snapshots (this worker's version 5 and an older worker's
version 1, with its controls) raise SnapshotError and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import hypothesis.strategies as st
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tests.session.fakes import FakeClock, action, applied, model_state
from worldserve.session.errors import SnapshotError
from worldserve.session.plan import ModelState
from worldserve.session.session import Session, SessionConfig
from worldserve.session.snapshot import restore, snapshot

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def valid_snapshot() -> bytes:
    session, _ = Session.create(SessionConfig(bucket=4, seed=9), scene="hills", clock=FakeClock())
    for block in range(3):
        session.accept_block(block)
        session.record_block(block, applied(action(1.0, 0.0, 0.0, 1.0, 0.5 * block), block + 1,
                                            bucket=4, scene="sea" if block == 2 else None),
                             np.zeros((1, 4, 4, 3), np.uint8))
    session.set_scene("sea")
    state = model_state(bucket=4, frames=2)
    state.family_state = {"prev": np.zeros((3, 4, 4), np.float32), "age": np.asarray(3, np.int64)}
    return snapshot(session, state)


@cache
def valid_lean_snapshot() -> bytes:
    """The same snapshot without the optional model fields (nil ones may be absent)."""
    doc = msgpack.unpackb(valid_snapshot(), raw=False)
    del doc["model"]["latents"]
    return bytes(msgpack.packb(doc, use_bin_type=True))


SEEDS = pytest.mark.parametrize("seed", [valid_snapshot, valid_lean_snapshot], ids=["full", "lean"])


def restores_or_rejects(data: bytes) -> None:
    """The only acceptable outcomes: a restored pair, or SnapshotError."""
    try:
        result = restore(data)
    except SnapshotError:
        return
    session, model = result
    assert isinstance(session, Session) and isinstance(model, ModelState)


@SEEDS
def test_valid_snapshot_restores_what_was_saved(seed: Callable[[], bytes]) -> None:
    """The fuzz tests' seeds are real snapshots: they restore to the session and model state
    they were made from (so a mutation that is accepted is judged against a working baseline)."""
    session, model = restore(seed())
    assert (session.config.bucket, session.config.seed, session.scene) == (4, 9, "sea")
    assert (session.blocks_committed, session.last_block_idx) == (0, 2)
    assert [getattr(e, "seq", None) for e in session.log] == [1, 2, None, 3]  # the scene's
    saved = model_state(bucket=4, frames=2)
    assert (model.bucket, model.sink_count, model.frame_index, model.scene) == (4, 1, 2, saved.scene)
    assert np.array_equal(model.frames, saved.frames) and np.array_equal(model.rng, saved.rng)


@SEEDS
def test_every_truncation_is_rejected(seed: Callable[[], bytes]) -> None:
    data = seed()
    for n in range(len(data)):
        try:
            restore(data[:n])
        except SnapshotError:
            continue
        raise AssertionError(f"truncation to {n} of {len(data)} bytes was accepted")


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_are_rejected(data: bytes) -> None:
    restores_or_rejects(data)


@FUZZ
@given(st.binary(max_size=64))
def test_random_bytes_after_a_valid_prefix_are_handled(tail: bytes) -> None:
    data = valid_snapshot()
    restores_or_rejects(data[: len(data) // 2] + tail)


@FUZZ
@given(st.data())
def test_byte_mutations_of_a_valid_snapshot_are_handled(data: st.DataObject) -> None:
    buf = bytearray(valid_snapshot())
    for _ in range(data.draw(st.integers(1, 8), label="edits")):
        pos = data.draw(st.integers(0, len(buf) - 1), label="pos")
        op = data.draw(st.sampled_from(["flip", "set", "insert", "delete"]), label="op")
        byte = data.draw(st.integers(0, 255), label="byte")
        if op == "flip":
            buf[pos] ^= 1 << (byte % 8)
        elif op == "set":
            buf[pos] = byte
        elif op == "insert":
            buf.insert(pos, byte)
        elif len(buf) > 1:
            del buf[pos]
    restores_or_rejects(bytes(buf))


# Any msgpack value, to put where a field was.
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


@SEEDS
@FUZZ
@given(st.data(), msgpack_values, st.booleans())
def test_structural_mutations_are_handled(
    seed: Callable[[], bytes], data: st.DataObject, value: Any, delete: bool
) -> None:
    doc = msgpack.unpackb(seed(), raw=False)
    path = data.draw(st.sampled_from(_paths(doc)), label="path")
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    restores_or_rejects(msgpack.packb(doc, use_bin_type=True))


def test_bombs_are_rejected_quickly() -> None:
    bombs = [
        b"\x91" * 100_000,  # deeply nested arrays
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4G items
        b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GiB
        b"\xc7\x01\x05\x00",  # ext type
        msgpack.packb({"format": 1, "version": 1, "session": {}, "log": {}, "model": {}}),
    ]
    for bomb in bombs:
        try:
            restore(bomb)
        except SnapshotError:
            continue
        raise AssertionError(f"accepted {bomb[:8]!r}")


def test_array_shape_that_overflows_is_rejected() -> None:
    doc = msgpack.unpackb(valid_snapshot(), raw=False)
    doc["model"]["frames"]["shape"] = [2**62, 2**62, 2**62, 3]
    try:
        restore(msgpack.packb(doc, use_bin_type=True))
    except SnapshotError:
        return
    raise AssertionError("accepted an impossible shape")
