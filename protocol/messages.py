"""WebSocket protocol v1: every message type, as a frozen dataclass, and its checks.

Each message is a dataclass whose ``TYPE`` is its wire tag; building one runs its checks
(a value out of range raises ``ProtocolError`` naming the field and the reason), so the
server and the SDK (``clients/sdk.py``) cannot put a malformed message on the wire.
``Message.to_wire`` gives the msgpack map (with ``type`` and ``v``) and ``encode`` its
bytes. Arrays and images travel as bytes (``Image``: raw RGB with dtype and shape, or an
encoded JPEG/PNG).

Reading messages off the wire (msgpack decoding, the type check of every field, the
``error`` reply for a bad one) is ``protocol/codec.py``; the package (``protocol``)
exports both. ``docs/protocol.md`` documents each message with an example.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, fields
from enum import IntEnum, StrEnum
from typing import Any, ClassVar, Literal

import msgpack
import numpy as np

from .vocab import CONTROLS, KEYS, MAX_SEED, MAX_TOKEN_CHARS, SESSION_ID_RE

PROTOCOL_VERSION = 1

MAX_PROMPT_CHARS = 1024
MAX_FPS = 60.0
MAX_LOOKAHEAD = 8
MAX_BLOCK_IDX = 2**53  # exact in every client's number type
MAX_SEQ = 2**53
MAX_DEADLINE_MS = 60_000.0
MAX_IMAGE_SIDE = 2048
MAX_TEXT = 4096  # any other free-text field (reasons, messages)

Codec = Literal["jpeg", "raw", "h264"]
Mode = Literal["push", "pull"]
ImageFormat = Literal["raw", "jpeg", "png"]


class ErrorCode(StrEnum):
    """Stable error codes on the wire (session/errors.py's errors carry theirs from here)."""

    BAD_MESSAGE = "bad_message"  # undecodable, unknown type, missing/bad field
    UNSUPPORTED_VERSION = "unsupported_version"
    TOO_BIG = "too_big"  # over the server's max message size (the socket closes 1009)
    RATE_LIMITED = "rate_limited"  # too many messages; this one was dropped
    OVER_QUOTA = "over_quota"  # the client opens sessions too fast or holds too many (closes 1013)
    UNAUTHORIZED = "unauthorized"  # missing or wrong API key (the socket closes 1008)
    NOT_STARTED = "not_started"  # the message needs a session: send start or resume first
    ALREADY_STARTED = "already_started"  # one session per connection
    WRONG_MODE = "wrong_mode"  # block requests are for pull-mode sessions
    NOT_READY = "not_ready"  # the server is warming up or draining (closes 1013)
    INTERNAL = "internal"  # a server bug (closes 1011)
    RUNNER_ERROR = "runner_error"  # the model failed this session's chunk; it is retried
    IGNORED_CONTROL = "ignored_control"  # the model does not take this control (sent once)
    # The session layer's (session/errors.py):
    MISSING_SESSION_STATE = "missing_session_state"
    STALE_BLOCK = "stale_block"
    AT_CAPACITY = "at_capacity"  # (closes 1013, with retry_after)
    ILLEGAL_TRANSITION = "illegal_transition"
    BAD_TOKEN = "bad_token"  # (closes 1008)
    # Scale-out (several workers sharing a session directory):
    PLACEMENT_REQUIRED = "placement_required"  # start without a valid router reservation
    DIRECTORY_UNAVAILABLE = "directory_unavailable"  # the shared directory cannot be reached
    SESSION_MOVED = "session_moved"  # resume at a worker that does not hold the session
    # Saved worlds (server/worlds.py):
    UNKNOWN_WORLD = "unknown_world"  # no such world (or not yours to delete)
    BAD_WORLD = "bad_world"  # a world that cannot be saved or read (a bad name, another version, corrupt)
    STORE_ERROR = "store_error"  # the store failed or is off; nothing was changed
    # The prompt filter (server/prompt_filter.py):
    PROMPT_REFUSED = "prompt_refused"  # a start's or a switch's prompt refused; nothing was changed


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001  # server shutdown
    POLICY = 1008  # auth / policy (bad API key, bad resume token, replaced by a resume)
    TOO_BIG = 1009
    INTERNAL = 1011
    TRY_AGAIN = 1013  # at capacity or not ready: retry after ``retry_after`` seconds


class ProtocolError(Exception):
    """A message that cannot be used: ``code`` for the wire, ``field`` and ``reason`` for people."""

    def __init__(self, reason: str, field: str | None = None, code: str = ErrorCode.BAD_MESSAGE):
        self.code = str(code)
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


def _require(ok: bool, name: str, reason: str) -> None:
    if not ok:
        raise ProtocolError(reason, name)


# --- images ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Image:
    """An RGB image: ``raw`` bytes of a (H, W, 3) uint8 array, or an encoded JPEG/PNG."""

    format: ImageFormat
    data: bytes = field(repr=False)
    shape: tuple[int, ...] | None = None  # raw only: (H, W, 3)
    dtype: str | None = None  # raw only: "uint8"

    def __post_init__(self) -> None:
        if self.format == "raw":
            _require(self.dtype == "uint8", "dtype", "raw images must have dtype 'uint8'")
            shape = self.shape
            _require(
                shape is not None and len(shape) == 3 and shape[2] == 3,
                "shape",
                f"raw images must have shape [H, W, 3], got {shape!r}",
            )
            assert shape is not None
            _check_side(shape[0], shape[1], "shape")
            _require(
                len(self.data) == shape[0] * shape[1] * 3,
                "data",
                f"{len(self.data)} bytes do not hold a {shape[0]}x{shape[1]}x3 uint8 array",
            )
        else:
            _require(self.shape is None and self.dtype is None, "shape", "only raw images have a shape")
            _require(len(self.data) > 0, "data", "empty image")

    @classmethod
    def from_array(cls, frame: np.ndarray, format: ImageFormat = "png", quality: int = 90) -> Image:
        """Wrap an (H, W, 3) uint8 array, encoding it when ``format`` is jpeg or png."""
        arr = np.ascontiguousarray(frame)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
            raise ValueError(f"image must be (H, W, 3) uint8, got {arr.shape} {arr.dtype}")
        if format == "raw":
            return cls("raw", arr.tobytes(), tuple(arr.shape), "uint8")
        from PIL import Image as PILImage

        buf = io.BytesIO()
        kw: dict[str, Any] = {"quality": quality} if format == "jpeg" else {}
        PILImage.fromarray(arr).save(buf, "JPEG" if format == "jpeg" else "PNG", **kw)
        return cls(format, buf.getvalue())

    def decode(self, max_pixels: int = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE) -> np.ndarray:
        """The image as an (H, W, 3) uint8 array of its own (writable: a model may hand it to
        torch as it is); ProtocolError if it cannot be read."""
        if self.format == "raw":
            assert self.shape is not None
            return np.frombuffer(self.data, np.uint8).reshape(self.shape).copy()
        from PIL import Image as PILImage

        try:
            want = "JPEG" if self.format == "jpeg" else "PNG"
            with PILImage.open(io.BytesIO(self.data), formats=(want,)) as img:  # no other decoder runs
                if img.format != want:
                    raise ProtocolError(f"data is {img.format}, not {want}", "data")
                w, h = img.size
                _check_side(h, w, "data")
                if w * h > max_pixels:
                    raise ProtocolError(f"{w}x{h} is over {max_pixels} pixels", "data")
                arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
        except ProtocolError:
            raise
        except Exception as exc:  # Pillow raises many types on bad input
            raise ProtocolError(f"cannot decode {self.format}: {exc}", "data") from None
        return np.array(arr, np.uint8, order="C")  # a copy: PIL's view is read-only

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "data": self.data}
        if self.format == "raw":
            out["shape"] = list(self.shape or ())
            out["dtype"] = self.dtype
        return out


def _check_side(h: object, w: object, name: str) -> None:
    ok = all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_IMAGE_SIDE for x in (h, w))
    _require(ok, name, f"image sides must be ints in [1, {MAX_IMAGE_SIDE}], got {h!r}x{w!r}")


# --- message base ---------------------------------------------------------------------


class Message:
    """Base of every message; subclasses are frozen dataclasses with a ``TYPE`` tag."""

    __slots__ = ()
    TYPE: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "v": PROTOCOL_VERSION}
        for f in fields(self):  # type: ignore[arg-type]
            out[f.name] = _to_wire(getattr(self, f.name))
        return out

    def encode(self) -> bytes:
        return msgpack.packb(self.to_wire(), use_bin_type=True)  # type: ignore[no-any-return]


def _to_wire(value: object) -> object:
    if isinstance(value, Image):
        return value.to_wire()
    if isinstance(value, tuple):
        return [_to_wire(v) for v in value]
    return value


def _check_int(name: str, value: int, lo: int, hi: int) -> None:
    _require(lo <= value <= hi, name, f"must be in [{lo}, {hi}], got {value}")


def _check_float(name: str, value: float, lo: float, hi: float, *, lo_open: bool = False) -> None:
    ok = (lo < value if lo_open else lo <= value) and value <= hi
    bracket = "(" if lo_open else "["
    _require(ok, name, f"must be in {bracket}{lo:g}, {hi:g}], got {value!r}")


def _check_text(name: str, value: str, limit: int) -> None:
    _require(len(value) <= limit, name, f"must be at most {limit} characters, got {len(value)}")


# --- client -> server -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start(Message):
    """Open a session on this connection (block 0 of a new epoch)."""

    TYPE: ClassVar[str] = "start"
    prompt: str = ""  # scene prompt, e.g. "a snowy forest at night"
    seed: int = 0
    # push: frames per second; pull: the expected request rate. None: the model's own (a Wan
    # recipe's 16, Matrix-Game's 12; 24 otherwise), which ``started.fps`` states. Added as
    # optional in protocol 1: older clients send 24, which is served as asked
    fps: float | None = None
    bucket: int = 64  # frame side in pixels, one of the server's buckets
    codec: Codec = "jpeg"
    mode: Mode = "push"
    lookahead: int = 1  # push: chunks generated ahead of display
    quality: int | None = None  # jpeg quality 1..95 (None: the server's default)
    observation: Image | None = None  # a real first frame to anchor the model on
    deadline_ms: float | None = None  # pull: deadline of block 0
    api_key: str | None = None  # when the server requires one (or send an Authorization header)
    session_id: str | None = None  # multi-worker: the reservation the router handed out
    world: str | None = None  # a saved world's id: fork a new session from it (its prompt, seed, size, rate)

    def __post_init__(self) -> None:
        _check_text("prompt", self.prompt, MAX_PROMPT_CHARS)
        if self.world is not None:
            _check_text("world", self.world, 64)
        _check_int("seed", self.seed, 0, MAX_SEED)
        if self.fps is not None:
            _check_float("fps", self.fps, 0.0, MAX_FPS, lo_open=True)
        _check_int("bucket", self.bucket, 1, MAX_IMAGE_SIDE)
        _check_int("lookahead", self.lookahead, 0, MAX_LOOKAHEAD)
        if self.quality is not None:
            _check_int("quality", self.quality, 1, 95)
        if self.deadline_ms is not None:
            _check_float("deadline_ms", self.deadline_ms, 0.0, MAX_DEADLINE_MS, lo_open=True)
        if self.api_key is not None:
            _check_text("api_key", self.api_key, 256)
        if self.session_id is not None:
            _require(
                SESSION_ID_RE.fullmatch(self.session_id) is not None,
                "session_id",
                f"must match {SESSION_ID_RE.pattern}",
            )


@dataclass(frozen=True, slots=True)
class Action(Message):
    """The client's controls now: held keys and a mouse/camera delta. Latest seq wins."""

    TYPE: ClassVar[str] = "action"
    seq: int  # strictly increasing per session, from 1
    keys: tuple[str, ...] = ()  # a subset of forward, back, left, right
    mouse: tuple[float, ...] = (0.0, 0.0)  # (dx, dy), each clipped to [-1, 1]

    def __post_init__(self) -> None:
        _check_int("seq", self.seq, 1, MAX_SEQ)
        _require(len(self.keys) <= len(KEYS), "keys", f"at most {len(KEYS)} keys")
        unknown = sorted(set(self.keys) - set(KEYS))
        _require(not unknown, "keys", f"unknown keys {unknown}; known keys are {list(KEYS)}")
        _require(len(self.mouse) == 2, "mouse", f"must be [dx, dy], got {len(self.mouse)} numbers")


@dataclass(frozen=True, slots=True)
class Prompt(Message):
    """Change the scene prompt; the server answers ``ack`` with the same ``id``."""

    TYPE: ClassVar[str] = "prompt"
    prompt: str
    id: int = 0

    def __post_init__(self) -> None:
        _check_text("prompt", self.prompt, MAX_PROMPT_CHARS)
        _check_int("id", self.id, 0, MAX_SEQ)


@dataclass(frozen=True, slots=True)
class Observation(Message):
    """A real frame committed into the session's context (re-anchors the model); acked."""

    TYPE: ClassVar[str] = "observation"
    image: Image
    id: int = 0

    def __post_init__(self) -> None:
        _check_int("id", self.id, 0, MAX_SEQ)


@dataclass(frozen=True, slots=True)
class Block(Message):
    """Pull mode: ask for block ``block_idx`` (the next one; the last one again resends
    it; 0 starts a new epoch)."""

    TYPE: ClassVar[str] = "block"
    block_idx: int
    deadline_ms: float | None = None

    def __post_init__(self) -> None:
        _check_int("block_idx", self.block_idx, 0, MAX_BLOCK_IDX)
        if self.deadline_ms is not None:
            _check_float("deadline_ms", self.deadline_ms, 0.0, MAX_DEADLINE_MS, lo_open=True)


@dataclass(frozen=True, slots=True)
class Resume(Message):
    """Re-attach a detached session with its token; ``block_idx`` is the next block the
    client wants (0: start a new epoch of the session)."""

    TYPE: ClassVar[str] = "resume"
    session_id: str
    token: str
    block_idx: int

    def __post_init__(self) -> None:
        _require(
            SESSION_ID_RE.fullmatch(self.session_id) is not None,
            "session_id",
            f"must match {SESSION_ID_RE.pattern}",
        )
        _check_text("token", self.token, MAX_TOKEN_CHARS)
        _check_int("block_idx", self.block_idx, 0, MAX_BLOCK_IDX)


@dataclass(frozen=True, slots=True)
class Keyframe(Message):
    """Ask for a keyframe (H.264) as the next frame."""

    TYPE: ClassVar[str] = "keyframe"


@dataclass(frozen=True, slots=True)
class Close(Message):
    """End the session for good (a dropped connection only detaches it)."""

    TYPE: ClassVar[str] = "close"
    reason: str = ""

    def __post_init__(self) -> None:
        _check_text("reason", self.reason, MAX_TEXT)


@dataclass(frozen=True, slots=True)
class Ping(Message):
    """Answered by ``pong`` with the same id (RTT and clock checks)."""

    TYPE: ClassVar[str] = "ping"
    id: int = 0

    def __post_init__(self) -> None:
        _check_int("id", self.id, 0, MAX_SEQ)


@dataclass(frozen=True, slots=True)
class Save(Message):
    """Save the session's state now as a named world (the owner's connection); answered ``saved``."""

    TYPE: ClassVar[str] = "save"
    name: str

    def __post_init__(self) -> None:
        _check_text("name", self.name, 80)


ClientMessage = Start | Action | Prompt | Observation | Block | Resume | Keyframe | Close | Ping | Save


# --- server -> client -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started(Message):
    TYPE: ClassVar[str] = "started"
    session_id: str
    token: str  # the resume token: keep it secret, it is shown only here
    protocol: int
    mode: Mode
    codec: Codec
    fps: float
    bucket: int
    width: int
    height: int
    chunk_frames: int  # frames per block (every block after the first of an epoch)
    level: int  # degradation level admitted at (0 = as asked)
    steps: int
    lookahead: int
    epoch: int
    buckets: tuple[int, ...]  # buckets this server serves
    # Added in protocol 1 without a version change (older servers leave them out):
    first_chunk_frames: int | None = None  # frames of block 0 (None: chunk_frames)
    controls: tuple[str, ...] = CONTROLS  # what the model takes; the rest is ignored
    block_idx: int = 0  # the first block sent: 0, or a forked world's saved point
    world: str | None = None  # the saved world it was forked from


@dataclass(frozen=True, slots=True)
class Resumed(Message):
    TYPE: ClassVar[str] = "resumed"
    session_id: str
    block_idx: int  # the next block the client will receive
    epoch: int
    requested: int  # pull: the last block the server has accepted (re-send later ones); -1
    replayed: int  # blocks re-sent from the server's buffer
    mode: Mode
    codec: Codec
    fps: float
    width: int
    height: int
    chunk_frames: int
    level: int
    # Restored from a snapshot another worker left (a migration or a crash): the block the
    # restored model state continues at (-1: not restored) and the blocks the stream is off
    # by. With block_idx N asked and K restored: N > K after a crash means blocks K..N-1
    # were shown but are not in the model's memory (numbering goes on at N); N < K means
    # blocks N..K-1 were generated but never delivered (numbering goes on at K).
    restored_from: int = -1
    gap_blocks: int = 0
    first_chunk_frames: int | None = None  # as in ``started``
    controls: tuple[str, ...] = CONTROLS
    # The session's new resume token: each resume or takeover replaces the token (the old
    # one no longer resumes it). None from servers that do not rotate: keep the old one.
    token: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None:
            _check_text("token", self.token, MAX_TOKEN_CHARS)


@dataclass(frozen=True, slots=True)
class Migrate(Message):
    """The worker is draining: resume this session at ``url`` (its state is there)."""

    TYPE: ClassVar[str] = "migrate"
    session_id: str
    url: str  # the target worker's WebSocket URL; "" when none is free: ask the router
    block_idx: int  # the next block the target generates (resend what you lack from it)
    worker: str = ""  # the target worker's id
    retry_after: float | None = None  # url "": seconds before asking the router


@dataclass(frozen=True, slots=True)
class Frame(Message):
    TYPE: ClassVar[str] = "frame"
    session_id: str
    block_idx: int
    frame: int  # frame index in the epoch: block_idx's first frame + i (``block_start``)
    pts_us: int  # presentation time in microseconds on the session's nominal frame clock
    action_seq: int  # the newest action folded into this frame (0: none yet)
    codec: Codec
    width: int
    height: int
    data: bytes = field(repr=False)
    key: bool  # a keyframe (always true for jpeg and raw)
    t_gen: float  # server wall clock (unix seconds) when the block was generated
    t_sent: float  # server wall clock when this message was sent


@dataclass(frozen=True, slots=True)
class Status(Message):
    TYPE: ClassVar[str] = "status"
    level: int
    fps: float  # frames sent per second over the last interval
    target_fps: float
    queue: int  # frames waiting to be sent to this client
    drops: int  # frames this client lost because it read too slowly (latest wins)
    skipped: int  # frames the server could not generate in time (repeat the last)
    misses: int  # blocks that finished after their deadline
    bucket: int
    steps: int
    lookahead: int
    utilisation: float  # predicted model utilisation of the whole server
    action_seq: int | None = None  # the action_seq of the newest frame sent (None: none sent yet)
    frame: int | None = None  # that frame's epoch frame index
    # The schedule the session runs (added in protocol 1; older servers leave them out): the
    # published recipe served (None: the default model) and the model timesteps of its ``steps``
    # (a trained step list; (): not stated)
    recipe: str | None = None
    timesteps: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Degradation(Message):
    TYPE: ClassVar[str] = "degradation"
    old_level: int
    new_level: int
    changes: tuple[str, ...]  # e.g. ["lookahead 1->0"]
    fps: float
    bucket: int
    steps: int
    lookahead: int


@dataclass(frozen=True, slots=True)
class Skipped(Message):
    TYPE: ClassVar[str] = "skipped"
    block_idx: int  # the next block, which comes later than its slot
    repeat_block_idx: int  # the block to keep showing (-1: none yet)
    frames: int


@dataclass(frozen=True, slots=True)
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    of: str  # "prompt" or "observation"
    id: int


@dataclass(frozen=True, slots=True)
class Error(Message):
    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    field: str | None = None  # the offending field of the client's message
    retry_after: float | None = None  # seconds (at_capacity, not_ready, rate_limited)
    fatal: bool = False  # the server closes the connection after this


@dataclass(frozen=True, slots=True)
class Saved(Message):
    """A world saved by ``save``: fork it with ``start`` and ``world: id``."""

    TYPE: ClassVar[str] = "saved"
    world: str  # its id
    name: str
    frames: int  # frames the session had made when it was saved
    block_idx: int  # the block a fork continues at


@dataclass(frozen=True, slots=True)
class Ended(Message):
    TYPE: ClassVar[str] = "ended"
    session_id: str
    reason: str  # client_close, deleted, expired, evicted, replaced, shutdown, failed, migrated


@dataclass(frozen=True, slots=True)
class Pong(Message):
    TYPE: ClassVar[str] = "pong"
    id: int
    t_server: float  # server wall clock (unix seconds)


ServerMessage = (
    Started
    | Resumed
    | Frame
    | Status
    | Degradation
    | Skipped
    | Ack
    | Error
    | Ended
    | Pong
    | Migrate
    | Saved
)

CLIENT_TYPES: dict[str, type[Message]] = {
    c.TYPE: c for c in (Start, Action, Prompt, Observation, Block, Resume, Keyframe, Close, Ping, Save)
}
SERVER_TYPES: dict[str, type[Message]] = {
    c.TYPE: c
    for c in (Started, Resumed, Frame, Status, Degradation, Skipped, Ack, Error, Ended, Pong, Migrate, Saved)
}
