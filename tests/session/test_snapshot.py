"""Snapshots: exact round trip, an older worker's versions still read, and validation that
names what is wrong."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from tests.session.fakes import FakeClock, action, applied, model_state
from worldserve.session.errors import SnapshotError
from worldserve.session.plan import ModelState
from worldserve.session.session import Session, SessionConfig, SessionStatus
from worldserve.session.snapshot import FORMAT, MAX_FRAMES, VERSION, restore, snapshot
from worldserve.session.store import SessionStore


def busy_session() -> tuple[Session, str]:
    """A session with every kind of state: counters, log events of every kind."""
    config = SessionConfig(
        fps=30.0, bucket=8, steps=3, lookahead=2, mode="pull", priority=-4, seed=2**63 + 5
    )
    session, token = Session.create(config, scene="hills", clock=FakeClock())
    out = np.zeros((1, 8, 8, 3), np.uint8)
    for block in range(4):
        session.accept_block(block, frames=2)
        vec = action(1.0, 0.0, 0.0, 0.0, 0.1 * block, -0.3)
        session.record_block(block, applied(vec, block + 1, bucket=8, steps=3), out)
    session.commit_block(0, frames=2)
    session.commit_block(1, frames=2)
    session.set_scene("desert")
    session.record_block(4, applied(action(0.0, 1.0), 9, bucket=8, steps=2, scene="desert",
                                    observations=(np.zeros((8, 8, 3), np.uint8),)), out)
    return session, token


def unpack(data: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return doc


def _array(arr: np.ndarray) -> dict[str, object]:
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.tobytes()}


def test_round_trip_is_exact() -> None:
    session, token = busy_session()
    state = model_state(bucket=8, frames=5, scene="desert")
    clock = FakeClock(50.0)
    data = snapshot(session, state)
    assert unpack(data)["version"] == VERSION == 6 and "controls" not in unpack(data)["session"]
    restored, model = restore(data, clock=clock)

    assert restored.id == session.id and restored.token_hash == session.token_hash
    assert restored.check_token(token)
    assert restored.config == session.config
    assert (restored.epoch, restored.scene) == (session.epoch, session.scene)
    for name in ("blocks_committed", "last_block_idx", "frames_due", "frames_committed"):
        assert getattr(restored, name) == getattr(session, name), name
    assert restored.log.start == session.log.start
    assert list(restored.log) == list(session.log)
    assert (restored.log.dropped, restored.log.capacity) == (
        session.log.dropped,
        session.log.capacity,
    )
    assert list(restored.log.replay(4)) == list(session.log.replay(4))

    for name in ("bucket", "sink_count", "frame_index", "scene"):
        assert getattr(model, name) == getattr(state, name), name
    for name in ("frames", "rng"):
        got, want = getattr(model, name), getattr(state, name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable  # an owned copy, not a view of the snapshot bytes


def test_restored_session_is_detached_until_resumed_with_its_token() -> None:
    session, token = busy_session()
    clock = FakeClock(50.0)
    restored, _ = restore(snapshot(session, model_state()), clock=clock)
    assert restored.status is SessionStatus.DETACHED and restored.detached_at == 50.0
    store = SessionStore(2, 10.0, clock=clock)
    store.install(restored)
    store.resume(restored.id, token)
    # The client continues where it left off: the next block, no gap, no repeat.
    assert store.open_block(restored.id, session.last_block_idx + 1).kind.value == "next"


def test_snapshot_keeps_the_token_hash_not_the_token() -> None:
    session, token = busy_session()
    data = snapshot(session, model_state())
    assert token.encode() not in data
    assert unpack(data)["session"]["token_sha256"] == session.token_hash


def test_empty_session_and_zero_frames_round_trip() -> None:
    session, _ = Session.create(SessionConfig(bucket=8))
    state = ModelState(8, np.zeros((0, 8, 8, 3), np.uint8), 0, 0, np.zeros(0, np.uint8), "")
    restored, model = restore(snapshot(session, state))
    assert restored.last_block_idx == -1 and model.frames.shape == (0, 8, 8, 3)


def test_snapshot_refuses_a_dtype_outside_the_allow_list() -> None:
    session, _ = busy_session()
    state = model_state()
    state.rng = np.zeros(4, dtype=np.complex64)
    with pytest.raises(SnapshotError, match="complex64"):
        snapshot(session, state)


def test_snapshot_over_the_size_limit_is_refused() -> None:
    session, _ = busy_session()
    with pytest.raises(SnapshotError, match="limit"):
        snapshot(session, model_state(), max_bytes=100)


def mutate(data: bytes, edit: Any) -> bytes:
    doc = unpack(data)
    edit(doc)
    out: bytes = msgpack.packb(doc, use_bin_type=True)
    return out


def _set(path: str, value: object) -> Any:
    keys = path.split(".")

    def edit(doc: dict[str, Any]) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value

    return edit


def _del(path: str) -> Any:
    keys = path.split(".")

    def edit(doc: dict[str, Any]) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        del doc[keys[-1]]

    return edit


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (_set("version", VERSION + 1), "unsupported version"),
        (_set("version", "1"), "version"),
        (_set("format", "other"), "format"),
        (_del("model"), "missing keys"),
        (_set("session.extra", 1), "unexpected keys"),
        (_set("session.epoch", -1), "epoch"),
        (_set("session.epoch", True), "epoch"),
        (_set("session.id", "bad id!"), "session id"),
        (_set("session.token_sha256", b"short"), "token_sha256"),
        (_set("session.config.fps", 0.0), "fps"),
        (_set("session.config.mode", "poll"), "mode"),
        (_set("session.config.seed", -3), "seed"),
        (_set("session.counters.blocks_committed", 99), "blocks_committed"),
        (_set("session.controls", {}), "unexpected keys .*controls"),
        (_set("log.capacity", 0), "capacity"),
        (_set("log.events", [{"kind": "teleport", "block": 1}]), "kind"),
        (
            _set(
                "log.events",
                [
                    {"kind": "scene", "block": 5, "scene": "a"},
                    {"kind": "scene", "block": 1, "scene": "b"},
                ],
            ),
            "block_idx",
        ),
        (_set("log.events", [{"kind": "observation", "block": 1, "digest": "zz"}]), "digest"),
        (_set("model.frames.shape", [5, 8, 8, 4]), "needs|frames"),
        (_set("model.frames.dtype", "object"), "dtype"),
        (_set("model.bucket", 16), "frames"),
        (_set("model.sink_count", 6), "sink_count"),
        (_set("model.rng.shape", [2, 16]), "shape"),
        (_set("model.scene", b"bytes"), "scene"),
    ],
)
def test_malformed_field_is_a_snapshot_error_naming_it(edit: Any, needle: str) -> None:
    session, _ = busy_session()
    data = mutate(snapshot(session, model_state(frames=5)), edit)
    with pytest.raises(SnapshotError, match=needle):
        restore(data)


def test_a_snapshot_without_the_optional_model_fields_restores_the_same_state() -> None:
    session, token = busy_session()
    state = model_state(bucket=8, frames=5, scene="desert")
    doc = unpack(snapshot(session, state))
    assert doc["model"].pop("latents") is None
    restored, model = restore(msgpack.packb(doc, use_bin_type=True), clock=FakeClock(50.0))
    assert restored.id == session.id and restored.check_token(token)
    assert np.array_equal(model.frames, state.frames) and model.frame_index == state.frame_index
    assert model.family_state == {} and model.latents is None


@pytest.mark.parametrize("version", [1, 4, 7])
def test_a_snapshot_of_another_version_is_refused_naming_the_one_read(version: int) -> None:
    session, _ = busy_session()
    doc = unpack(snapshot(session, model_state(bucket=8, frames=5)))
    doc["version"] = version
    with pytest.raises(SnapshotError, match=f"unsupported version {version}; this worker reads 6"):
        restore(msgpack.packb(doc, use_bin_type=True))


def test_a_default_family_state_with_latents_is_refused() -> None:
    session, _ = busy_session()
    state = model_state()
    state.latents = np.zeros((3, 4, 2, 2), np.float32)
    with pytest.raises(SnapshotError, match="latent family only"):
        snapshot(session, state)
    doc = unpack(snapshot(session, model_state()))
    doc["model"]["latents"] = _array(np.zeros((3, 4, 2, 2), np.float32))
    with pytest.raises(SnapshotError, match=r"latents: expected nil for the default family"):
        restore(msgpack.packb(doc, use_bin_type=True))


def test_too_many_frames_is_rejected() -> None:
    session, _ = busy_session()
    state = model_state(bucket=2, frames=MAX_FRAMES + 1)
    with pytest.raises(SnapshotError, match="frames"):
        restore(snapshot(session, state))
    with pytest.raises(SnapshotError, match="frames"):
        restore(snapshot(session, model_state(frames=5)), max_frames=4)


def test_oversized_input_is_rejected_before_parsing() -> None:
    with pytest.raises(SnapshotError, match="limit"):
        restore(b"\x00" * 1001, max_bytes=1000)


@pytest.mark.parametrize(
    "data", [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"format": FORMAT}), "text"]
)
def test_garbage_is_a_snapshot_error(data: Any) -> None:
    with pytest.raises(SnapshotError):
        restore(data)


def test_trailing_bytes_are_rejected() -> None:
    session, _ = busy_session()
    with pytest.raises(SnapshotError):
        restore(snapshot(session, model_state()) + b"\x00")


_FIRED: list[str] = []


def _fire(tag: str) -> None:
    _FIRED.append(tag)


class _Payload:
    """Calls ``_fire`` when unpickled: proof that something unpickled it."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_fire, ("unpickled",))


@pytest.mark.parametrize(
    "where",
    ["the whole snapshot", "an array's bytes, dtype object", "an array's bytes, dtype uint8", "an ext field"],
)
def test_a_pickled_payload_is_refused_and_never_run(where: str) -> None:
    import pickle

    bomb = pickle.dumps(_Payload())
    session, _ = busy_session()
    data = snapshot(session, model_state())
    if where == "the whole snapshot":
        data = bomb
    elif where.startswith("an array's bytes"):
        dtype = where.rsplit(" ", 1)[1]
        data = mutate(data, _set("model.frames", {"dtype": dtype, "shape": [len(bomb)], "data": bomb}))
    else:
        data = mutate(data, _set("model.scene", msgpack.ExtType(1, bomb)))
    _FIRED.clear()
    with pytest.raises(SnapshotError):
        restore(data)
    assert _FIRED == []
    pickle.loads(bomb)  # the payload does fire when unpickled: the check above can fail
    assert _FIRED == ["unpickled"]


def test_a_version_5_snapshot_reads_its_continuation_and_actions_as_family_state() -> None:
    session, token = busy_session()
    doc = unpack(snapshot(session, model_state(bucket=8, frames=5)))
    kv, prev = np.ones((2, 1, 5, 3, 2, 4), np.float32), np.full((3, 8, 8), 0.5, np.float32)
    seen = {"keys": _array(np.zeros((1, 2), np.int32)), "pixels": _array(np.zeros((1, 4, 2, 2), np.uint8))}
    canvas = {"keys": _array(np.zeros((1, 2), np.int32)), "codes": _array(np.zeros((1, 4, 4), np.uint16)),
              "position": _array(np.zeros(2)), "seed": 7, "seen": seen}
    del doc["model"]["family_state"]
    doc["version"] = 5
    doc["model"]["continuation"] = {"kv": _array(kv), "prev": _array(prev), "anchor": None, "anchor_offset": None,
                                    "anchor_wait": 3, "anchor_age": 11, "canvas": canvas}
    doc["model"]["actions"] = {"keyboard": _array(np.ones((4, 6), np.float32)),
                               "mouse": _array(np.zeros((4, 2), np.float32)), "first": 2, "anchor_frame": 1}
    restored, model = restore(msgpack.packb(doc, use_bin_type=True))
    fs = model.family_state
    assert restored.check_token(token)
    assert np.array_equal(fs["kv"], kv) and np.array_equal(fs["prev"], prev)
    assert int(fs["anchor_wait"]) == 3 and int(fs["anchor_age"]) == 11 and "anchor" not in fs
    assert int(fs["canvas_seed"]) == 7 and fs["canvas_codes"].shape == (1, 4, 4)
    assert fs["canvas_seen"].shape == (1, 4, 2, 2)
    assert fs["action_keyboard"].shape == (4, 6) and int(fs["action_first"]) == 2
    assert int(fs["action_anchor_frame"]) == 1


def test_a_version_5_snapshot_with_a_bad_counter_is_a_snapshot_error() -> None:
    session, _ = busy_session()
    doc = unpack(snapshot(session, model_state(bucket=8, frames=5)))
    del doc["model"]["family_state"]
    doc["version"] = 5
    doc["model"]["continuation"] = {"kv": None, "prev": None, "anchor_wait": -1}
    with pytest.raises(SnapshotError, match="anchor_wait"):
        restore(msgpack.packb(doc, use_bin_type=True))
