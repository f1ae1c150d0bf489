"""Handoffs: what another worker needs to serve a session this one held, as one blob.

A handoff wraps a session snapshot (session/snapshot.py: the session, its event log and
the runner's ``ModelState``) with the server-side state a worker keeps beside it: what the
client asked for (its ``start``), the next block_idx, the degradation level, the last
applied action and, for a migration, the last few generated blocks (the client may not
have received them yet; the target resends them on resume). msgpack, one map::

    {"format": "worldserve/handoff", "version": 2, "kind": "checkpoint" | "migration",
     "session_id", "epoch", "next_block", "level", "created", "inputs",
     "request": {start fields},
     "action": {"seq", "seen", "vec": <6 float32 bytes> | nil},
     "replay": [{"block", "action_seq", "shape": [F, H, W, 3], "data": <uint8 bytes>, "pts_us", "late"}],
     "snapshot": <session snapshot bytes>,
     "presentation": [frame, us]}

``inputs`` is what is left of the session's costly-input budget (prompts, observations,
new epochs; server/limits.py), in inputs: the next worker goes on from it rather than from
a full burst.

Versions: this release writes 2 and reads 2 and 1 (N and N-1, as snapshots do), so a rolling
upgrade migrates sessions both ways across one version step: version 1 had no ``inputs``
and reads as an empty budget.

``presentation`` (where the epoch's next frame goes on its ``pts_us`` clock,
session/presentation.py) and each replayed block's ``pts_us`` and ``late`` (push: the
display frames a ``skipped`` named before it) are optional: a handoff without them (written
before they existed) continues the clock at ``frame * 1e6 / fps``.

A ``checkpoint`` is written every few seconds while a session runs (crash recovery:
``replay`` is empty, it stays small); a ``migration`` is written once by a draining
worker. ``decode`` validates every field with the snapshot's checked reader
(session/msgfields.py) and raises ``HandoffError`` naming it, never another exception; the
inner snapshot is validated by ``restore``. No pickle. It lives beside the snapshot and the
session log, torch-free, because all three are one session's state on the wire.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import msgpack
import numpy as np

from worldserve.protocol import ProtocolError, Start, from_wire
from worldserve.protocol.vocab import SESSION_ID_RE
from worldserve.session.errors import SnapshotError
from worldserve.session.msgfields import MAX_INT, Fields, unpack
from worldserve.session.plan import ACTION_DIM, ModelState
from worldserve.session.presentation import Presentation
from worldserve.session.session import Clock, Session
from worldserve.session.snapshot import MAX_SNAPSHOT_BYTES
from worldserve.session.snapshot import restore as restore_snapshot

FORMAT = "worldserve/handoff"
VERSION = 2
READS = (VERSION, VERSION - 1)  # N and N-1
MAX_REPLAY = 64  # blocks
MAX_BYTES = MAX_SNAPSHOT_BYTES * 2
Kind = Literal["checkpoint", "migration"]
_KEYS = {"format", "version", "kind", "session_id", "epoch", "next_block", "level", "created",
         "request", "action", "replay", "snapshot"}
_KEYS_BY_VERSION = {1: _KEYS, 2: _KEYS | {"inputs"}}
_OPTIONAL = frozenset({"presentation"})
_REPLAY_KEYS = {"block", "action_seq", "shape", "data"}
_REPLAY_OPTIONAL = frozenset({"pts_us", "late"})
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
    inputs: float = 0.0  # costly inputs (prompts, observations, new epochs) left in its budget

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
            "inputs": float(self.inputs),
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
    """Validate and rebuild a handoff (its snapshot is checked by ``Handoff.restore``);
    ``HandoffError`` naming the field, never another exception."""
    try:
        return _decode(unpack(data, max_bytes))
    except SnapshotError as exc:  # the checked reader's (session/msgfields.py)
        raise HandoffError(str(exc)) from None


def _decode(obj: object) -> Handoff:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise HandoffError(f"not a map with format {FORMAT!r}")
    version = obj.get("version")
    if type(version) is not int or version not in READS:
        raise HandoffError(f"unsupported version; this worker reads {' and '.join(map(str, READS))}")
    top = Fields(obj, "handoff", _KEYS_BY_VERSION[version], _OPTIONAL)
    inputs = top.get_float("inputs") if version >= 2 else 0.0
    if inputs < 0:
        raise HandoffError("handoff.inputs: expected a count >= 0")
    kind = top.get_str("kind", 16)
    if kind not in ("checkpoint", "migration"):
        raise HandoffError("handoff.kind: expected 'checkpoint' or 'migration'")
    sid = top.get_str("session_id", 64)
    if SESSION_ID_RE.fullmatch(sid) is None:
        raise HandoffError("handoff.session_id: expected a session id")
    request = obj["request"]
    if not isinstance(request, dict):
        raise HandoffError("handoff.request: expected a map")
    try:
        start = from_wire(Start, {k: v for k, v in request.items() if k not in _DROPPED_REQUEST_FIELDS})
    except ProtocolError as exc:
        raise HandoffError(f"handoff.request.{exc.field or ''}: {exc.reason}") from None
    assert isinstance(start, Start)
    action = top.get_map("action", {"seq", "seen", "vec"})
    vec = action.get_bin("vec", 4 * ACTION_DIM) if action.present("vec") else None
    if vec is not None and len(vec) != 4 * ACTION_DIM:
        raise HandoffError(f"handoff.action.vec: expected {4 * ACTION_DIM} bytes or nil")
    replay = top.get_list("replay", MAX_REPLAY)
    return Handoff(
        kind,  # type: ignore[arg-type]
        sid,
        top.get_int("epoch", 0, MAX_INT),
        top.get_int("next_block", 0, MAX_INT),
        top.get_int("level", 0, MAX_INT),
        start,
        None if vec is None else np.frombuffer(vec, "<f4").astype(np.float32),
        action.get_int("seq", 0, MAX_INT),
        action.get_int("seen", 0, MAX_INT),
        tuple(_replay(Fields(r, f"handoff.replay[{i}]", _REPLAY_KEYS, _REPLAY_OPTIONAL)) for i, r in enumerate(replay)),
        top.get_bin("snapshot", MAX_SNAPSHOT_BYTES),
        top.get_float("created"),
        _presentation(top) if top.present("presentation") else None,
        inputs,
    )


def _presentation(top: Fields) -> Presentation:
    value = top._d["presentation"]
    if not isinstance(value, list) or len(value) != 2:
        raise HandoffError("handoff.presentation: expected [frame, us]")
    at = Fields({"frame": value[0], "us": value[1]}, "handoff.presentation", {"frame", "us"})
    us = at.get_float("us")
    if us < 0:
        raise HandoffError("handoff.presentation.us: expected a time >= 0")
    return Presentation(at.get_int("frame", 0, MAX_INT), us)


def _replay(m: Fields) -> ReplayBlock:
    listed = m.get_list("shape", 4)
    shape = tuple(n for n in listed if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4096)
    if len(listed) != 4 or len(shape) != 4 or shape[3] != 3:
        raise HandoffError(f"{m.path}.shape: expected [F, H, W, 3]")
    data = m.get_bin("data", math.prod(shape))
    if len(data) != math.prod(shape):
        raise HandoffError(f"{m.path}.data: expected {math.prod(shape)} bytes")
    return ReplayBlock(
        m.get_int("block", 0, MAX_INT), m.get_int("action_seq", 0, MAX_INT),
        np.frombuffer(data, np.uint8).reshape(shape),
        m.get_int("pts_us", 0, MAX_INT) if m.present("pts_us") else None,
        m.get_int("late", 0, MAX_INT) if m.present("late") else 0,
    )
