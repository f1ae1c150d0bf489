"""Session snapshots: the compact state that lets another worker resume a session.

``snapshot(session, model_state) -> bytes`` and ``restore(data) -> (Session, ModelState)``.
The format is msgpack, one map; this worker writes version 6::

    {"format": "worldserve/session-snapshot", "version": 6,
     "session": {id, token_sha256, epoch, scene, config{...}, counters{...}},
     "log":     {capacity, dropped, start{seed, scene, bucket, steps}, events[...]},
     "model":   {bucket, frames, sink_count, frame_index, rng, scene, family,
                 latents, family_state}}

``family`` names the model family ("default" for the embedded one). ``latents`` is nil for
the default family, which keeps pixel frames: ``frames`` is (N, bucket, bucket, 3), sink
frames first. A latent family (the Wan family) keeps ``latents``, float32 (N, C, h, w), sink
frames first, and ``frames`` is empty, (0, height, width, 3), or holds the family's anchor
image, (1, height, width, 3) (Matrix-Game's). ``family_state`` is a map of names to arrays,
the family's own state (session/family_state.py): this module checks its envelope only, the
family what it holds when it restores. The default family keeps its cache's keys and values
and its reference's memory there, so that, restored from it, the session makes exactly the
frames it would have made on the old worker; Matrix-Game the actions its window was made
with.

``latents`` is optional: nil or absent where a state has none. Version 5 (the default
family's ``continuation`` and Matrix-Game's ``actions`` maps in place of ``family_state``) is
read too, converted (session/snapshot_v5.py); versions 1 to 4 are not.

Arrays travel as ``{"dtype", "shape", "data"}`` with a dtype from ``DTYPES``
(``session/msgfields.py``, stored little-endian). ``restore`` validates everything (format,
version, exact key sets, types, ranges, dtype and shape against the byte length, ``max_bytes``
and ``max_frames``) and
raises ``SnapshotError`` on anything malformed, never another exception. No pickle.

Decisions:
- The resume token is kept as its SHA-256 (``token_sha256``), never in plaintext: the new
  worker can check the client's token, while a leaked snapshot cannot resume the session.
- The restored session is DETACHED (TTL counted from the restore) until the client
  resumes with its token. Clock readings (created, last seen) are per-process and are not
  carried; neither is the frame clock's phase (the scheduler's, rebuilt from the
  counters). The KV cache travels in the family's state: rebuilt from the clean frames it
  would be close, not exact (they are rounded, and a window frame's keys were computed
  against context that has left the window). Without it the runner rebuilds it from
  ``model.frames`` or ``model.latents``.
- A session's actions travel in its replay log (what each block was made with) and, for a
  family that keeps them, in its family state; no separate controls.
"""

from __future__ import annotations

import time

import msgpack
import numpy as np

from worldserve.session import snapshot_v5
from worldserve.session.errors import SnapshotError
from worldserve.session.eventlog import (
    MAX_CAPACITY,
    ActionEvent,
    EpochStart,
    Event,
    EventLog,
    ObservationEvent,
    SceneEvent,
    SettingsEvent,
)
from worldserve.session.family_state import MAX_ENTRIES, MAX_NDIM, check_envelope
from worldserve.session.msgfields import MAX_INT, Fields, pack_array, unpack
from worldserve.session.plan import ACTION_DIM, ModelState
from worldserve.session.session import (
    MAX_BUCKET,
    MAX_SCENE_CHARS,
    Clock,
    Mode,
    Session,
    SessionConfig,
    SessionStatus,
)

FORMAT = "worldserve/session-snapshot"
VERSION = 6  # the one schema, written and read
MAX_FAMILY_CHARS = 64
MAX_SNAPSHOT_BYTES = 64 << 20
MAX_FRAMES = 256  # clean frames in model.frames (sink + window)
MAX_RNG_BYTES = 1 << 16
MAX_ACTION_ROWS = 4096  # frames of one logged block's actions



def snapshot(
    session: Session, model_state: ModelState, *, max_bytes: int = MAX_SNAPSHOT_BYTES
) -> bytes:
    """Serialize a session and its runner state as version 6. SnapshotError if an array's
    dtype is not in ``DTYPES``, the state's latents do not match its family, or the result
    is over ``max_bytes``."""
    config = session.config
    latents = model_state.latents
    try:
        check_envelope(model_state.family_state)
    except ValueError as exc:
        raise SnapshotError(str(exc)) from exc
    if (model_state.family == "default") != (latents is None):
        raise SnapshotError(
            f"family {model_state.family!r}'s model state: latents are kept by a latent family only"
        )
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "session": {
            "id": session.id,
            "token_sha256": session.token_hash,
            "epoch": session.epoch,
            "scene": session.scene,
            "config": {
                "fps": config.fps,
                "bucket": config.bucket,
                "steps": config.steps,
                "lookahead": config.lookahead,
                "mode": config.mode,
                "priority": config.priority,
                "seed": config.seed,
            },
            "counters": {
                "blocks_committed": session.blocks_committed,
                "last_block_idx": session.last_block_idx,
                "frames_due": session.frames_due,
                "frames_committed": session.frames_committed,
            },
        },
        "log": {
            "capacity": session.log.capacity,
            "dropped": session.log.dropped,
            "start": _pack_start(session.log.start),
            "events": [_pack_event(e) for e in session.log],
        },
        "model": {
            "bucket": model_state.bucket,
            "frames": pack_array(model_state.frames),
            "sink_count": model_state.sink_count,
            "frame_index": model_state.frame_index,
            "rng": pack_array(model_state.rng),
            "scene": model_state.scene,
            "family": model_state.family,
            "latents": None if latents is None else pack_array(latents),
            "family_state": {k: pack_array(v) for k, v in model_state.family_state.items()},
        },
    }
    data: bytes = msgpack.packb(doc, use_bin_type=True)
    if len(data) > max_bytes:
        raise SnapshotError(f"snapshot is {len(data)} bytes, over the limit of {max_bytes}")
    return data


def restore(
    data: bytes,
    *,
    clock: Clock = time.monotonic,
    max_bytes: int = MAX_SNAPSHOT_BYTES,
    max_frames: int = MAX_FRAMES,
) -> tuple[Session, ModelState]:
    """Validate and rebuild a snapshot: a DETACHED ``Session`` and its ``ModelState``."""
    obj = unpack(data, max_bytes)
    # Format and version first: another version may have other keys.
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise SnapshotError(f"not a snapshot map with format {FORMAT!r}")
    version = obj.get("version")
    if type(version) is int and version == snapshot_v5.VERSION:  # N - 1: a rolling upgrade's
        obj = snapshot_v5.upgrade(obj)
        version = obj["version"]
    if type(version) is not int or version != VERSION:
        shown = repr(version) if isinstance(version, int | float | str | None) else "?"
        raise SnapshotError(f"unsupported version {shown[:32]}; this worker reads {VERSION}")
    top = Fields(obj, "snapshot", {"format", "version", "session", "log", "model"})
    try:
        session = _restore_session(top, clock)
        model = _restore_state(top.get_map("model", _MODEL_KEYS, _MODEL_OPTIONAL), max_frames)
    except ValueError as exc:  # a constructor's own validation
        raise SnapshotError(str(exc)) from exc
    return session, model


# Encoding helpers.


def _pack_start(start: EpochStart) -> dict[str, object]:
    return {"seed": start.seed, "scene": start.scene, "bucket": start.bucket, "steps": start.steps}


def _pack_event(event: Event) -> dict[str, object]:
    match event:
        case ActionEvent():
            action = np.array(event.action, dtype=np.float32)
            return {
                "kind": "action",
                "block": event.block_idx,
                "seq": event.seq,
                "action": pack_array(action),
            }
        case SceneEvent():
            return {"kind": "scene", "block": event.block_idx, "scene": event.scene}
        case ObservationEvent():
            return {"kind": "observation", "block": event.block_idx, "digest": event.digest}
        case SettingsEvent():
            return {
                "kind": "settings",
                "block": event.block_idx,
                "bucket": event.bucket,
                "steps": event.steps,
            }


# Decoding: every read goes through Fields, which raises SnapshotError naming the field.

_SESSION_KEYS = {"id", "token_sha256", "epoch", "scene", "config", "counters"}
_CONFIG_KEYS = {"fps", "bucket", "steps", "lookahead", "mode", "priority", "seed"}
_COUNTER_KEYS = {"blocks_committed", "last_block_idx", "frames_due", "frames_committed"}
_LOG_KEYS = {"capacity", "dropped", "start", "events"}
_START_KEYS = {"seed", "scene", "bucket", "steps"}
_MODEL_KEYS = {"bucket", "frames", "sink_count", "frame_index", "rng", "scene", "family", "family_state"}
_MODEL_OPTIONAL = frozenset({"latents"})
_EVENT_KEYS = {
    "action": {"kind", "block", "seq", "action"},
    "scene": {"kind", "block", "scene"},
    "observation": {"kind", "block", "digest"},
    "settings": {"kind", "block", "bucket", "steps"},
}


def _restore_session(top: Fields, clock: Clock) -> Session:
    s = top.get_map("session", _SESSION_KEYS)
    c = s.get_map("config", _CONFIG_KEYS)
    mode_name = c.get_str("mode", 8)
    if mode_name not in ("push", "pull"):
        raise SnapshotError(f"{c.path}.mode: expected 'push' or 'pull', got {mode_name!r}")
    mode: Mode = "push" if mode_name == "push" else "pull"
    config = SessionConfig(
        fps=c.get_float("fps"),
        bucket=c.get_int("bucket", 1, MAX_BUCKET),
        steps=c.get_int("steps", 1, MAX_INT),
        lookahead=c.get_int("lookahead", 0, MAX_INT),
        mode=mode,
        priority=c.get_int("priority", -MAX_INT, MAX_INT),
        seed=c.get_int("seed", 0, 2**64 - 1),
    )
    n = s.get_map("counters", _COUNTER_KEYS)
    token_hash = s.get_bin("token_sha256", 32)
    if len(token_hash) != 32:
        raise SnapshotError(f"{s.path}.token_sha256: expected 32 bytes, got {len(token_hash)}")
    return Session(
        config,
        token_hash,
        session_id=s.get_str("id", 128),
        scene=s.get_str("scene", MAX_SCENE_CHARS),
        epoch=s.get_int("epoch", 0, MAX_INT),
        status=SessionStatus.DETACHED,
        clock=clock,
        log=_restore_log(top.get_map("log", _LOG_KEYS)),
        blocks_committed=n.get_int("blocks_committed", 0, MAX_INT),
        last_block_idx=n.get_int("last_block_idx", -1, MAX_INT),
        frames_due=n.get_int("frames_due", 0, MAX_INT),
        frames_committed=n.get_int("frames_committed", 0, MAX_INT),
    )


def _block_actions(m: Fields, key: str) -> np.ndarray:
    """A logged block's actions: (frames, ACTION_DIM) floats, row-major."""
    vec = m.get_array(key, "float32", 1)
    if vec.size == 0 or vec.size % ACTION_DIM or vec.size > MAX_ACTION_ROWS * ACTION_DIM:
        raise SnapshotError(
            f"{m.path}.{key}: expected a multiple of {ACTION_DIM} floats (a block's actions), "
            f"got {vec.size}"
        )
    return vec


def _restore_log(m: Fields) -> EventLog:
    capacity = m.get_int("capacity", 1, MAX_CAPACITY)
    st = m.get_map("start", _START_KEYS)
    start = EpochStart(
        seed=st.get_int("seed", 0, 2**64 - 1),
        scene=st.get_str("scene", MAX_SCENE_CHARS),
        bucket=st.get_int("bucket", 1, MAX_BUCKET),
        steps=st.get_int("steps", 1, MAX_INT),
    )
    raw_events = m.get_list("events", capacity)
    events = [_restore_event(e, f"{m.path}.events[{i}]") for i, e in enumerate(raw_events)]
    return EventLog.from_events(
        start, events, dropped=m.get_int("dropped", 0, MAX_INT), capacity=capacity
    )


def _restore_event(obj: object, path: str) -> Event:
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if not isinstance(kind, str) or kind not in _EVENT_KEYS:
        raise SnapshotError(f"{path}: expected a map with a known kind")
    e = Fields(obj, path, _EVENT_KEYS[kind])
    block = e.get_int("block", 0, MAX_INT)
    if kind == "action":
        return ActionEvent(
            block, e.get_int("seq", 0, MAX_INT), tuple(_block_actions(e, "action").tolist())
        )
    if kind == "scene":
        return SceneEvent(block, e.get_str("scene", MAX_SCENE_CHARS))
    if kind == "observation":
        digest = e.get_str("digest", 64)
        if len(digest) != 64 or not all(ch in "0123456789abcdef" for ch in digest):
            raise SnapshotError(f"{path}.digest: expected 64 lowercase hex chars")
        return ObservationEvent(block, digest)
    return SettingsEvent(block, e.get_int("bucket", 1, MAX_BUCKET), e.get_int("steps", 1, MAX_INT))


def _restore_model(m: Fields, max_frames: int) -> ModelState:
    bucket = m.get_int("bucket", 1, MAX_BUCKET)
    frames = m.get_array("frames", "uint8", 4)
    if frames.shape[1:] != (bucket, bucket, 3) or frames.shape[0] > max_frames:
        raise SnapshotError(
            f"{m.path}.frames: expected (N <= {max_frames}, {bucket}, {bucket}, 3), got {frames.shape}"
        )
    rng = m.get_array("rng", "uint8", 1)
    if rng.size > MAX_RNG_BYTES:
        raise SnapshotError(f"{m.path}.rng: {rng.size} bytes, over {MAX_RNG_BYTES}")
    return ModelState(
        bucket=bucket,
        frames=frames,
        sink_count=m.get_int("sink_count", 0, frames.shape[0]),
        frame_index=m.get_int("frame_index", 0, MAX_INT),
        rng=rng,
        scene=m.get_str("scene", MAX_SCENE_CHARS),
    )


def _restore_latent_model(m: Fields, max_frames: int) -> ModelState:
    bucket = m.get_int("bucket", 1, MAX_BUCKET)
    frames = m.get_array("frames", "uint8", 4)
    if frames.shape[0] > 1 or frames.shape[3] != 3 or not all(1 <= n <= 4 * MAX_BUCKET for n in frames.shape[1:3]):
        raise SnapshotError(
            f"{m.path}.frames: expected (0 or 1, height, width, 3) for a latent state, got {frames.shape}"
        )
    latents = m.get_array("latents", "float32", 4)
    if latents.shape[0] > max_frames:
        raise SnapshotError(f"{m.path}.latents: {latents.shape[0]} frames, over {max_frames}")
    if not np.isfinite(latents).all():
        raise SnapshotError(f"{m.path}.latents: not all finite")
    rng = m.get_array("rng", "uint8", 1)
    if rng.size > MAX_RNG_BYTES:
        raise SnapshotError(f"{m.path}.rng: {rng.size} bytes, over {MAX_RNG_BYTES}")
    family = m.get_str("family", MAX_FAMILY_CHARS)
    if family == "default":
        raise SnapshotError(f"{m.path}.family: a latent state's family is not 'default'")
    return ModelState(
        bucket=bucket,
        frames=frames,
        sink_count=m.get_int("sink_count", 0, latents.shape[0]),
        frame_index=m.get_int("frame_index", 0, MAX_INT),
        rng=rng,
        scene=m.get_str("scene", MAX_SCENE_CHARS),
        latents=latents,
        family=family,
    )


def _restore_state(m: Fields, max_frames: int) -> ModelState:
    """The "model" map: a pixel state (the default family: ``latents`` nil) or a latent
    family's, with the family's own state (its envelope checked here, its meaning by the
    family when it restores)."""
    pixel = m.get_str("family", MAX_FAMILY_CHARS) == "default"
    if pixel and m.present("latents"):
        raise SnapshotError(f"{m.path}.latents: expected nil for the default family")
    if not pixel and not m.present("latents"):
        raise SnapshotError(f"{m.path}.latents: a latent family's state needs its latents")
    state = _restore_model(m, max_frames) if pixel else _restore_latent_model(m, max_frames)
    state.family_state = m.get_named_arrays("family_state", MAX_ENTRIES, MAX_NDIM)
    check_envelope(state.family_state, f"{m.path}.family_state")
    return state
