"""Handoffs: what another worker needs to serve a session this one held, as one blob.

A handoff wraps a session snapshot (session/snapshot.py: the session, its event log and
the runner's ``ModelState``) with the server-side state a worker keeps beside it: what the
client asked for (its ``start``), the next block_idx, the degradation level, the last
applied action and, for a migration, the last few generated blocks (the client may not
have received them yet; the target resends them on resume). msgpack, one map::

    {"format": "worldserve/handoff", "version": 1, "kind": "checkpoint" | "migration",
     "session_id", "epoch", "next_block", "level", "created",
     "request": {start fields},
     "action": {"seq", "seen", "vec": <6 float32 bytes> | nil},
     "replay": [{"block", "action_seq", "shape": [F, H, W, 3], "data": <uint8 bytes>, "pts_us", "late"}],
     "snapshot": <session snapshot bytes>,
     "presentation": [frame, us]}

``presentation`` (where the epoch's next frame goes on its ``pts_us`` clock,
session/presentation.py) and each replayed block's ``pts_us`` and ``late`` (push: the
display frames a ``skipped`` named before it) are optional: a handoff without them (written
before they existed) continues the clock at ``frame * 1e6 / fps``.

A ``checkpoint`` is written every few seconds while a session runs (crash recovery:
``replay`` is empty, it stays small); a ``migration`` is written once by a draining
worker. ``decode`` validates every field and raises ``HandoffError``, never another
exception; the inner snapshot is validated by ``restore``. No pickle.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
import numpy as np

from worldserve.protocol import ProtocolError, Start, from_wire
from worldserve.protocol.vocab import SESSION_ID_RE
from worldserve.session.errors import SnapshotError
from worldserve.session.msgfields import MAX_INT
from worldserve.session.plan import ACTION_DIM, ModelState
from worldserve.session.presentation import Presentation
from worldserve.session.session import Clock, Session
from worldserve.session.snapshot import MAX_SNAPSHOT_BYTES
from worldserve.session.snapshot import restore as restore_snapshot

FORMAT = "worldserve/handoff"
VERSION = 1
MAX_REPLAY = 64  # blocks
MAX_BYTES = MAX_SNAPSHOT_BYTES * 2
Kind = Literal["checkpoint", "migration"]
_KEYS = {"format", "version", "kind", "session_id", "epoch", "next_block", "level", "created",
         "request", "action", "replay", "snapshot"}
_OPTIONAL = {"presentation"}
_REPLAY_KEYS = {"block", "action_seq", "shape", "data"}
_DROPPED_REQUEST_FIELDS = ("type", "v", "observation", "api_key", "session_id")


class HandoffError(ValueError):
    """A handoff blob that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True, eq=False)
class ReplayBlock:
    block_idx: int
    action_seq: int
    frames: np.ndarray  # (chunk_frames, H, W, 3) uint8
    pts_us: int | None = None  # its first frame's presentation time (None: not recorded)
    late: int = 0  # push: display frames skipped right before it


@dataclass(frozen=True, slots=True, eq=False)
class Handoff:
    kind: Kind
    session_id: str
    epoch: int
    next_block: int  # the first block not generated: the restored state continues here
    level: int  # degradation level when it was taken
    request: Start  # what the client asked for (no observation, no API key)
    action: np.ndarray | None  # the last applied action, (ACTION_DIM,) float32
    action_seq: int
    seen_seq: int  # the newest action seq the server has seen
    replay: tuple[ReplayBlock, ...]  # recent blocks, oldest first (migrations)
    snapshot: bytes  # session/snapshot.py
    created: float  # wall clock (unix seconds)
    presentation: Presentation | None = None  # the epoch's pts_us clock (None: not recorded)

    def encode(self) -> bytes:
        request = {k: v for k, v in self.request.to_wire().items() if k not in _DROPPED_REQUEST_FIELDS}
        vec = None if self.action is None else np.ascontiguousarray(self.action, "<f4").tobytes()
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "kind": self.kind,
            "session_id": self.session_id,
            "epoch": self.epoch,
            "next_block": self.next_block,
            "level": self.level,
            "created": float(self.created),
            "request": request,
            "action": {"seq": self.action_seq, "seen": self.seen_seq, "vec": vec},
            "replay": [
                {
                    "block": r.block_idx,
                    "action_seq": r.action_seq,
                    "shape": list(r.frames.shape),
                    "data": np.ascontiguousarray(r.frames, np.uint8).tobytes(),
                    **({} if r.pts_us is None else {"pts_us": r.pts_us, "late": r.late}),
                }
                for r in self.replay
            ],
            "snapshot": self.snapshot,
        }
        if self.presentation is not None:
            doc["presentation"] = [self.presentation.frame, float(self.presentation.us)]
        data: bytes = msgpack.packb(doc, use_bin_type=True)
        return data

    def restore(self, clock: Clock = time.monotonic) -> tuple[Session, ModelState]:
        """The snapshot's DETACHED session and model state; HandoffError if unusable."""
        try:
            session, state = restore_snapshot(self.snapshot, clock=clock)
        except SnapshotError as exc:
            raise HandoffError(f"snapshot: {exc}") from exc
        if session.id != self.session_id or session.epoch != self.epoch:
            raise HandoffError(
                f"snapshot is of session {session.id!r} epoch {session.epoch}, the handoff of "
                f"{self.session_id!r} epoch {self.epoch}"
            )
        return session, state


def decode(data: bytes, *, max_bytes: int = MAX_BYTES) -> Handoff:
    """Validate and rebuild a handoff (its snapshot is checked by ``Handoff.restore``)."""
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) > max_bytes:
        raise HandoffError(f"expected at most {max_bytes} bytes")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:  # the C unpacker raises many types on bad input
        raise HandoffError(f"not valid msgpack: {type(exc).__name__}") from exc
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise HandoffError(f"not a map with format {FORMAT!r}")
    if obj.get("version") != VERSION or type(obj.get("version")) is not int:
        raise HandoffError(f"unsupported version; this worker reads {VERSION}")
    if set(obj) - _OPTIONAL != _KEYS:
        unexpected = len(set(obj) - _KEYS - _OPTIONAL)
        raise HandoffError(f"keys: missing {sorted(_KEYS - set(obj))}, unexpected {unexpected}")
    kind = obj["kind"]
    if kind not in ("checkpoint", "migration"):
        raise HandoffError("kind: expected 'checkpoint' or 'migration'")
    sid = obj["session_id"]
    if not isinstance(sid, str) or SESSION_ID_RE.fullmatch(sid) is None:
        raise HandoffError("session_id: expected a session id")
    created = obj["created"]
    if isinstance(created, bool) or not isinstance(created, int | float) or not math.isfinite(created):
        raise HandoffError("created: expected a finite number")
    request = obj["request"]
    if not isinstance(request, dict):
        raise HandoffError("request: expected a map")
    try:
        start = from_wire(Start, {k: v for k, v in request.items() if k not in _DROPPED_REQUEST_FIELDS})
    except ProtocolError as exc:
        raise HandoffError(f"request.{exc.field or ''}: {exc.reason}") from None
    assert isinstance(start, Start)
    action = _map(obj["action"], "action", {"seq", "seen", "vec"})
    vec = action["vec"]
    if vec is not None and (not isinstance(vec, bytes) or len(vec) != 4 * ACTION_DIM):
        raise HandoffError(f"action.vec: expected {4 * ACTION_DIM} bytes or nil")
    snapshot = obj["snapshot"]
    if not isinstance(snapshot, bytes):
        raise HandoffError("snapshot: expected bytes")
    replay = obj["replay"]
    if not isinstance(replay, list) or len(replay) > MAX_REPLAY:
        raise HandoffError(f"replay: expected a list of at most {MAX_REPLAY}")
    return Handoff(
        kind,
        sid,
        _int(obj["epoch"], "epoch"),
        _int(obj["next_block"], "next_block"),
        _int(obj["level"], "level"),
        start,
        None if vec is None else np.frombuffer(vec, "<f4").astype(np.float32),
        _int(action["seq"], "action.seq"),
        _int(action["seen"], "action.seen"),
        tuple(_replay(r, f"replay[{i}]") for i, r in enumerate(replay)),
        snapshot,
        float(created),
        _presentation(obj.get("presentation")),
    )


def _presentation(value: object) -> Presentation | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or isinstance(value[1], bool)
        or not isinstance(value[1], int | float)
        or not math.isfinite(value[1])
        or not 0 <= value[1] <= MAX_INT
    ):
        raise HandoffError("presentation: expected [frame, us]")
    return Presentation(_int(value[0], "presentation[0]"), float(value[1]))


def _map(obj: object, path: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(obj, dict) or set(obj) != keys:
        raise HandoffError(f"{path}: expected a map with keys {sorted(keys)}")
    return obj


def _int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise HandoffError(f"{path}: expected an int >= 0")
    return value


def _replay(obj: object, path: str) -> ReplayBlock:
    if not isinstance(obj, dict) or not _REPLAY_KEYS <= set(obj) <= _REPLAY_KEYS | {"pts_us", "late"}:
        raise HandoffError(f"{path}: expected a map with keys {sorted(_REPLAY_KEYS)} (and pts_us, late)")
    m: dict[str, Any] = obj
    shape = m["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) != 4
        or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4096 for n in shape)
        or shape[3] != 3
    ):
        raise HandoffError(f"{path}.shape: expected [F, H, W, 3]")
    data = m["data"]
    if not isinstance(data, bytes) or len(data) != math.prod(shape):
        raise HandoffError(f"{path}.data: expected {math.prod(shape)} bytes")
    frames = np.frombuffer(data, np.uint8).reshape(shape)
    pts = m.get("pts_us")
    return ReplayBlock(
        _int(m["block"], f"{path}.block"), _int(m["action_seq"], f"{path}.action_seq"), frames,
        None if pts is None else _int(pts, f"{path}.pts_us"),
        _int(m.get("late", 0), f"{path}.late"),
    )
