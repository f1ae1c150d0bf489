"""Session snapshots: the compact state that lets another worker resume a session.

``snapshot(session, model_state) -> bytes`` and ``restore(data) -> (Session, ModelState)``.
The format is msgpack, one map; this worker writes version 5::

    {"format": "worldserve/session-snapshot", "version": 5,
     "session": {id, token_sha256, epoch, scene, config{...}, counters{...}},
     "log":     {capacity, dropped, start{seed, scene, bucket, steps}, events[...]},
     "model":   {bucket, frames, sink_count, frame_index, rng, scene, family,
                 latents, continuation, actions}}

``family`` names the model family ("default" for the embedded one). ``latents`` is nil for
the default family, which keeps pixel frames: ``frames`` is (N, bucket, bucket, 3), sink
frames first. A latent family (the Wan family) keeps ``latents``, float32 (N, C, h, w), sink
frames first, and ``frames`` is empty, (0, height, width, 3), or holds the family's anchor
image, (1, height, width, 3) (Matrix-Game's). ``continuation`` (session/plan.py; the default
family exports one) is nil or a map::

    {kv: float32 (2, L, N, T, H, D), prev: float32 (C, H, W), anchor: float32 (C, H, W) or nil,
     anchor_offset: float32 (2,) or nil, anchor_wait: int, anchor_age: int, canvas}

``canvas`` (optional: nil or absent where the runner keeps no world canvas) is a map
``{keys: int32 (N, 2), codes: uint16 (N, 16, 16), position: float64 (2,), seed: int, seen}``, at
most ``MAX_CANVAS_TILES`` tiles; ``seen`` (optional: nil or absent where no observation was
kept) is ``{keys: int32 (M, 2), pixels: uint8 (M, 4, 64, 64)}``, the pixels observations
showed per tile (model/default/reference/canvas/seen.py).

with N the number of frames (or latents) the state holds. Restored from it the session
makes exactly the frames it would have made on the old worker. ``actions`` (an
``ActionTrace``; Matrix-Game exports one) is nil or a map::

    {keyboard: float32 (N, K), mouse: float32 (N, M), first: int, anchor_frame: int}

one row a pixel frame (K >= 1 and M >= 0 the family's action widths, at most
``MAX_ACTION_WIDTH``; N at most ``MAX_ACTION_ROWS``), ``anchor_frame`` at most the state's
``frame_index``.

``latents``, ``continuation`` and ``actions`` are optional: nil or absent where a state has
none. Versions 1 to 4 were development formats no release wrote; they are not read.

Arrays travel as ``{"dtype", "shape", "data"}`` with a dtype from ``DTYPES``
(``session/msgfields.py``, stored little-endian). ``restore`` validates everything (format, version, exact key sets, types,
ranges, dtype and shape against the byte length, ``max_bytes`` and ``max_frames``) and
raises ``SnapshotError`` on anything malformed, never another exception. No pickle.

Decisions:
- The resume token is kept as its SHA-256 (``token_sha256``), never in plaintext: the new
  worker can check the client's token, while a leaked snapshot cannot resume the session.
- The restored session is DETACHED (TTL counted from the restore) until the client
  resumes with its token. Clock readings (created, last seen) are per-process and are not
  carried; neither is the frame clock's phase (the scheduler's, rebuilt from the
  counters). The KV cache travels in the continuation: rebuilt from the clean frames it
  would be close, not exact (they are rounded, and a window frame's keys were computed
  against context that has left the window). Without one the runner rebuilds it from
  ``model.frames`` or ``model.latents``.
- A session's actions travel in its replay log (what each block was made with) and, for a
  family that exports one, in the model state's action trace; no separate controls.
"""

from __future__ import annotations

import time

import msgpack
import numpy as np

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
from worldserve.session.msgfields import MAX_INT, Fields, pack_array, unpack
from worldserve.session.plan import ACTION_DIM, ActionTrace, CanvasState, Continuation, ModelState
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
VERSION = 5  # the one schema, written and read
MAX_FAMILY_CHARS = 64
MAX_SNAPSHOT_BYTES = 64 << 20
MAX_FRAMES = 256  # clean frames in model.frames (sink + window)
MAX_RNG_BYTES = 1 << 16
MAX_ACTION_ROWS = 4096  # pixel frames of an action trace
MAX_ACTION_WIDTH = 64  # a family's keyboard or mouse width



def snapshot(
    session: Session, model_state: ModelState, *, max_bytes: int = MAX_SNAPSHOT_BYTES
) -> bytes:
    """Serialize a session and its runner state as version 5. SnapshotError if an array's
    dtype is not in ``DTYPES``, the state's latents do not match its family, or the result
    is over ``max_bytes``."""
    config = session.config
    cont, actions, latents = model_state.continuation, model_state.actions, model_state.latents
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
            "continuation": None if cont is None else _pack_continuation(cont),
            "actions": None if actions is None else _pack_actions(actions),
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


def _pack_continuation(c: Continuation) -> dict[str, object]:
    return {
        "kv": pack_array(np.asarray(c.kv, np.float32)),
        "prev": pack_array(np.asarray(c.prev, np.float32)),
        "anchor": None if c.anchor is None else pack_array(np.asarray(c.anchor, np.float32)),
        "anchor_offset": (
            None if c.anchor_offset is None else pack_array(np.asarray(c.anchor_offset, np.float32))
        ),
        "anchor_wait": c.anchor_wait,
        "anchor_age": c.anchor_age,
        "canvas": None if c.canvas is None else _pack_canvas(c.canvas),
    }


def _pack_canvas(c: CanvasState) -> dict[str, object]:
    seen = None
    if c.seen is not None and c.seen_keys is not None and len(c.seen):
        seen = {"keys": pack_array(np.asarray(c.seen_keys, np.int32)), "pixels": pack_array(np.asarray(c.seen, np.uint8))}
    return {
        "keys": pack_array(np.asarray(c.keys, np.int32)),
        "codes": pack_array(np.asarray(c.codes, np.uint16)),
        "position": pack_array(np.asarray(c.position, np.float64)),
        "seed": int(c.seed),
        "seen": seen,
    }


def _pack_actions(a: ActionTrace) -> dict[str, object]:
    return {
        "keyboard": pack_array(np.asarray(a.keyboard, np.float32)),
        "mouse": pack_array(np.asarray(a.mouse, np.float32)),
        "first": a.first,
        "anchor_frame": a.anchor_frame,
    }


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
_MODEL_KEYS = {"bucket", "frames", "sink_count", "frame_index", "rng", "scene", "family"}
_MODEL_OPTIONAL = frozenset({"latents", "continuation", "actions"})
_CONTINUATION_KEYS = {"kv", "prev", "anchor", "anchor_offset", "anchor_wait", "anchor_age"}
_CONTINUATION_OPTIONAL = frozenset({"canvas"})
_CANVAS_KEYS = {"keys", "codes", "position", "seed"}
_CANVAS_OPTIONAL = frozenset({"seen"})
_SEEN_KEYS = {"keys", "pixels"}
MAX_CANVAS_TILES = 1024  # more than a canvas keeps (model/default/reference/canvas/canvas.py: the torus's 256 tiles)
SEEN_SIDE = 64  # a seen tile's pixels per side (model/default/reference/canvas/seen.py: a tile's world units)
_ACTION_KEYS = {"keyboard", "mouse", "first", "anchor_frame"}
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
    family's, with its continuation and action trace where it has them."""
    pixel = m.get_str("family", MAX_FAMILY_CHARS) == "default"
    if pixel and m.present("latents"):
        raise SnapshotError(f"{m.path}.latents: expected nil for the default family")
    if not pixel and not m.present("latents"):
        raise SnapshotError(f"{m.path}.latents: a latent family's state needs its latents")
    state = _restore_model(m, max_frames) if pixel else _restore_latent_model(m, max_frames)
    held = state.frames.shape[0] if state.latents is None else state.latents.shape[0]
    if m.present("continuation"):
        state.continuation = _restore_continuation(m.get_map("continuation", _CONTINUATION_KEYS, _CONTINUATION_OPTIONAL), held)
    if m.present("actions"):
        state.actions = _restore_actions(m.get_map("actions", _ACTION_KEYS), state.frame_index)
    return state


def _restore_actions(m: Fields, frame_index: int) -> ActionTrace:
    keyboard = m.get_array("keyboard", "float32", 2)
    mouse = m.get_array("mouse", "float32", 2)
    rows = keyboard.shape[0]
    if rows > MAX_ACTION_ROWS or not 1 <= keyboard.shape[1] <= MAX_ACTION_WIDTH:
        raise SnapshotError(
            f"{m.path}.keyboard: expected (N <= {MAX_ACTION_ROWS}, 1..{MAX_ACTION_WIDTH}), got {keyboard.shape}"
        )
    if mouse.shape[0] != rows or mouse.shape[1] > MAX_ACTION_WIDTH:
        raise SnapshotError(
            f"{m.path}.mouse: expected ({rows}, 0..{MAX_ACTION_WIDTH}) like the keyboard's rows, got {mouse.shape}"
        )
    for name, arr in (("keyboard", keyboard), ("mouse", mouse)):
        if not np.isfinite(arr).all():
            raise SnapshotError(f"{m.path}.{name}: not all finite")
    return ActionTrace(
        keyboard=keyboard,
        mouse=mouse,
        first=m.get_int("first", 0, MAX_INT),
        anchor_frame=m.get_int("anchor_frame", 0, frame_index),
    )


def _restore_continuation(m: Fields, frames: int) -> Continuation:
    kv = m.get_array("kv", "float32", 6)
    if kv.shape[0] != 2 or kv.shape[2] != frames:
        raise SnapshotError(f"{m.path}.kv: expected (2, L, {frames}, T, H, D), got {kv.shape}")
    prev = m.get_array("prev", "float32", 3)
    anchor = m.get_optional_array("anchor", "float32", 3)
    if anchor is not None and anchor.shape != prev.shape:
        raise SnapshotError(f"{m.path}.anchor: expected prev's shape {prev.shape}, got {anchor.shape}")
    offset = m.get_optional_array("anchor_offset", "float32", 1)
    if offset is not None and offset.shape != (2,):
        raise SnapshotError(f"{m.path}.anchor_offset: expected shape (2,), got {offset.shape}")
    for name, arr in (("kv", kv), ("prev", prev), ("anchor", anchor), ("anchor_offset", offset)):
        if arr is not None and not np.isfinite(arr).all():
            raise SnapshotError(f"{m.path}.{name}: not all finite")
    return Continuation(
        kv=kv,
        prev=prev,
        anchor=anchor,
        anchor_offset=offset,
        anchor_wait=m.get_int("anchor_wait", 0, MAX_INT),
        anchor_age=m.get_int("anchor_age", 0, MAX_INT),
        canvas=_restore_canvas(m.get_map("canvas", _CANVAS_KEYS, _CANVAS_OPTIONAL)) if m.present("canvas") else None,
    )


def _restore_canvas(m: Fields) -> CanvasState:
    keys = m.get_array("keys", "int32", 2)
    codes = m.get_array("codes", "uint16", 3)
    n = keys.shape[0]
    if keys.shape != (n, 2) or codes.shape[0] != n or codes.shape[1] != codes.shape[2] or n > MAX_CANVAS_TILES:
        raise SnapshotError(f"{m.path}: keys {keys.shape} and codes {codes.shape} are not N tiles (N <= {MAX_CANVAS_TILES})")
    if len({(int(a), int(b)) for a, b in keys}) != n:
        raise SnapshotError(f"{m.path}.keys: a tile is listed twice")
    position = m.get_array("position", "float64", 1)
    if position.shape != (2,) or not np.isfinite(position).all():
        raise SnapshotError(f"{m.path}.position: expected two finite numbers, got {position}")
    seen_keys = seen = None
    if m.present("seen"):
        sm = m.get_map("seen", _SEEN_KEYS)
        seen_keys, seen = sm.get_array("keys", "int32", 2), sm.get_array("pixels", "uint8", 4)
        k = seen_keys.shape[0]
        if seen_keys.shape != (k, 2) or seen.shape != (k, 4, SEEN_SIDE, SEEN_SIDE) or k > MAX_CANVAS_TILES:
            raise SnapshotError(f"{sm.path}: keys {seen_keys.shape} and pixels {seen.shape} are not M tiles of "
                                f"(4, {SEEN_SIDE}, {SEEN_SIDE}) (M <= {MAX_CANVAS_TILES})")
        if len({(int(a), int(b)) for a, b in seen_keys}) != k:
            raise SnapshotError(f"{sm.path}.keys: a tile is listed twice")
    return CanvasState(keys=keys, codes=codes, position=position, seed=m.get_int("seed", 0, MAX_INT),
                       seen_keys=seen_keys, seen=seen)
