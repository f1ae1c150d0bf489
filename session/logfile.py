"""A served session's replay log as a file: what ``GET /admin/sessions/{id}/log`` returns
and ``worldserve replay LOG`` (model/replay.py) regenerates frame for frame.

msgpack, one map::

    {"format": "worldserve/session-log", "version": 1,
     "session": id, "epoch": n, "model": family name, "dtype": the runner's float type,
     "reference": what the model read beside its cache (``Capabilities.reference``),
     "log":     the snapshot's log map (session/snapshot.py): capacity, dropped, start, events,
     "frames":  {digest: array} the real frames the observation events name,
     "outputs": [[block_idx, digest of the block's frames], ...] (the newest ``capacity``)}

The log records what the runner was given (session/eventlog.py), so a runner of the same
family and weights, started from the seed and fed the same inputs, makes the same frames;
``outputs`` lets the replay check every block. Reading validates like a snapshot does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgpack

from worldserve.session.errors import SnapshotError
from worldserve.session.eventlog import EpochStart, Event, EventLog, ObservationEvent, digest
from worldserve.session.msgfields import MAX_INT, Fields, pack_array, unpack
from worldserve.session.session import Session
from worldserve.session.snapshot import (
    _LOG_KEYS,
    MAX_SNAPSHOT_BYTES,
    _pack_event,
    _pack_start,
    _restore_log,
)

FORMAT = "worldserve/session-log"
VERSION = 1
_KEYS = {"format", "version", "session", "epoch", "model", "dtype", "log", "frames", "outputs"}


@dataclass(frozen=True, slots=True)
class LogFile:
    session_id: str
    epoch: int
    model: str  # the family that served it (model/registry.py's name)
    dtype: str  # the runner's float type ("float32", "bfloat16")
    log: EventLog  # observation events carry their frames
    outputs: dict[int, str]  # block_idx -> digest of the frames the runner made
    reference: str = ""  # what the model read beside its cache (``Capabilities.reference``: "anchor", "canvas")


@dataclass(frozen=True, slots=True)
class Capture:
    """A session's log as it stood, copied cheaply (lists of its immutable events) so that
    ``encode`` may run on another thread while the session goes on."""

    session_id: str
    epoch: int
    model: str
    dtype: str
    reference: str
    capacity: int
    dropped: int
    start: EpochStart
    events: tuple[Event, ...]
    outputs: tuple[tuple[int, str], ...]


def capture(session: Session, model: str, dtype: str, reference: str = "") -> Capture:
    """Copy what ``encode`` needs (O(events), no frame copied)."""
    log = session.log
    return Capture(session.id, session.epoch, model, dtype, reference, log.capacity, log.dropped,
                   log.start, tuple(log), tuple(log.outputs))


def encode(cap: Capture) -> bytes:
    """A captured log as bytes: the costly part (frames packed), safe off the event loop."""
    frames = {e.digest: pack_array(e.frame) for e in cap.events
              if isinstance(e, ObservationEvent) and e.frame is not None}
    doc = {
        "format": FORMAT, "version": VERSION, "session": cap.session_id, "epoch": cap.epoch,
        "model": cap.model, "dtype": cap.dtype, "reference": cap.reference,
        "log": {"capacity": cap.capacity, "dropped": cap.dropped, "start": _pack_start(cap.start),
                "events": [_pack_event(e) for e in cap.events]},
        "frames": frames,
        "outputs": [[b, d] for b, d in cap.outputs],
    }
    data: bytes = msgpack.packb(doc, use_bin_type=True)
    return data


def pack(session: Session, model: str, dtype: str, reference: str = "") -> bytes:
    """A session's replay log as bytes."""
    return encode(capture(session, model, dtype, reference))


def read(data: bytes, *, max_bytes: int = 4 * MAX_SNAPSHOT_BYTES) -> LogFile:
    """Validate and read a log file; SnapshotError names what is wrong."""
    obj = unpack(data, max_bytes)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise SnapshotError(f"not a session log (format {FORMAT!r})")
    if obj.get("version") != VERSION:
        raise SnapshotError(f"unsupported session log version; this reads {VERSION}")
    top = Fields(obj, "log file", _KEYS, frozenset({"reference", "canvas"}))
    log = _restore_log(top.get_map("log", _LOG_KEYS))
    raw_frames = obj.get("frames")
    if not isinstance(raw_frames, dict):
        raise SnapshotError("log file.frames: expected a map")
    frames = {}
    for key in raw_frames:
        if not isinstance(key, str):
            raise SnapshotError("log file.frames: keys must be digests")
        frame = Fields(raw_frames, "log file.frames", set(raw_frames)).get_array(key, "uint8", 3)
        if digest(frame) != key:
            raise SnapshotError(f"log file.frames[{key[:12]}...]: the frame does not match its digest")
        frames[key] = frame
    events = [replace(e, frame=frames.get(e.digest)) if isinstance(e, ObservationEvent) else e
              for e in log]
    log = EventLog.from_events(log.start, events, dropped=log.dropped, capacity=log.capacity,
                              frame_bytes=max_bytes)
    outputs: dict[int, str] = {}
    for i, pair in enumerate(top.get_list("outputs", log.capacity)):
        if (not isinstance(pair, list) or len(pair) != 2 or type(pair[0]) is not int
                or not 0 <= pair[0] <= MAX_INT or not isinstance(pair[1], str) or len(pair[1]) != 64):
            raise SnapshotError(f"log file.outputs[{i}]: expected [block_idx, digest]")
        outputs[pair[0]] = pair[1]
    reference = top.get_str("reference", 32) if top.present("reference") else ""
    if not reference and obj.get("canvas") is not None:  # a log of an earlier worker: a flag
        if type(obj["canvas"]) is not bool:
            raise SnapshotError("log file.canvas: expected true or false")
        reference = "canvas" if obj["canvas"] else "anchor"
    return LogFile(
        top.get_str("session", 64), top.get_int("epoch", 0, MAX_INT), top.get_str("model", 64),
        top.get_str("dtype", 32), log, outputs, reference,
    )
