"""One client session: its configuration, scene, counters, replay log and status.

State changes only through ``Session`` methods, each with a precondition on the status;
a call whose precondition fails raises ``IllegalTransition``::

    ACTIVE ──detach()──► DETACHED ──attach()──► ACTIVE
       └──────close()──────┴──────close()──────► CLOSED (final)

Counters, not phases: ``last_block_idx`` is the newest block accepted in this epoch,
``blocks_committed`` / ``frames_committed`` count what the runner finished and
``frames_due`` what was accepted; the scheduler closes the gap. A new epoch is a new
``Session`` object (same id and token, ``epoch + 1``), installed by the store.

The plaintext resume token exists only in ``Session.create``'s return value; a session
keeps its SHA-256 (``token_hash``) and checks a presented token with
``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np

from worldserve.protocol.vocab import MAX_SEED, MAX_TOKEN_CHARS, SESSION_ID_RE
from worldserve.session.errors import IllegalTransition, StaleBlock
from worldserve.session.eventlog import (
    DEFAULT_CAPACITY,
    DEFAULT_FRAME_BYTES,
    Applied,
    EpochStart,
    EventLog,
)

Clock = Callable[[], float]
Mode = Literal["push", "pull"]

MAX_FPS = 240.0
MAX_BUCKET = 4096  # pixels per side
MAX_STEPS = 64
MAX_LOOKAHEAD = 64
PRIORITY_RANGE = (-1000, 1000)
MAX_SCENE_CHARS = 4096
_FRESH_COUNTERS = (0, -1, 0, 0)  # blocks_committed, last_block_idx, frames_due, frames_committed


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")


def hash_token(token: str) -> bytes:
    """SHA-256 of a resume token: what sessions and snapshots keep instead of the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How a session is served. Immutable: change it with ``Session.reconfigure``."""

    fps: float = 24.0  # push mode: frames per second of the session's frame clock
    bucket: int = 64  # output side length in pixels; one of the runner's buckets
    steps: int = 4  # denoising steps per chunk
    lookahead: int = 1  # push mode: chunks generated ahead of display
    mode: Mode = "push"  # "push": the server paces frames; "pull": the client asks per block
    priority: int = 0  # higher is served first among equal deadlines
    seed: int = 0  # seed of the session's noise generator; replay starts from it

    def __post_init__(self) -> None:
        fps = self.fps
        if (
            isinstance(fps, bool)
            or not isinstance(fps, int | float)
            or not math.isfinite(fps)
            or not 0.0 < fps <= MAX_FPS
        ):
            raise ValueError(f"fps must be a number in (0, {MAX_FPS:g}], got {fps!r}")
        object.__setattr__(self, "fps", float(fps))
        _check_int("bucket", self.bucket, 1, MAX_BUCKET)
        _check_int("steps", self.steps, 1, MAX_STEPS)
        _check_int("lookahead", self.lookahead, 0, MAX_LOOKAHEAD)
        if self.mode not in ("push", "pull"):
            raise ValueError(f"mode must be 'push' or 'pull', got {self.mode!r}")
        _check_int("priority", self.priority, *PRIORITY_RANGE)
        _check_int("seed", self.seed, 0, MAX_SEED)


class SessionStatus(StrEnum):
    ACTIVE = "active"  # a client is attached
    DETACHED = "detached"  # no client; resumable with the token until the store's TTL
    CLOSED = "closed"  # final; the store has dropped (or is dropping) its state


class Session:
    """One session's logical state (see the module docstring for the rules)."""

    __slots__ = (
        "_blocks_committed",
        "_clock",
        "_config",
        "_detached_at",
        "_epoch",
        "_frames_committed",
        "_frames_due",
        "_last_block_idx",
        "_scene",
        "_status",
        "created_at",
        "id",
        "last_seen",
        "log",
        "token_hash",
        "token_issued_at",
    )

    def __init__(
        self,
        config: SessionConfig,
        token_hash: bytes,
        *,
        session_id: str | None = None,
        scene: str = "",
        epoch: int = 0,
        status: SessionStatus = SessionStatus.ACTIVE,
        clock: Clock = time.monotonic,
        log: EventLog | None = None,
        log_capacity: int = DEFAULT_CAPACITY,
        log_frame_bytes: int = DEFAULT_FRAME_BYTES,
        blocks_committed: int = 0,
        last_block_idx: int = -1,
        frames_due: int = 0,
        frames_committed: int = 0,
    ) -> None:
        if session_id is None:
            sid = secrets.token_urlsafe(12)
        elif isinstance(session_id, str) and SESSION_ID_RE.fullmatch(session_id):
            sid = session_id
        else:
            raise ValueError(f"session id must match {SESSION_ID_RE.pattern}, got {session_id!r}")
        if not isinstance(token_hash, bytes) or len(token_hash) != 32:
            raise ValueError("token_hash must be 32 bytes (SHA-256)")
        if status is SessionStatus.CLOSED:
            raise ValueError(f"cannot build session {sid!r} in status closed")
        _check_scene(scene)
        # Fast path for a fresh session (attach is on the hot path); restores check all.
        counters = (blocks_committed, last_block_idx, frames_due, frames_committed)
        if epoch != 0 or counters != _FRESH_COUNTERS:
            _check_int("epoch", epoch, 0, 2**63 - 1)
            _check_int("last_block_idx", last_block_idx, -1, 2**63 - 1)
            _check_int("blocks_committed", blocks_committed, 0, last_block_idx + 1)
            _check_int("frames_due", frames_due, 0, 2**63 - 1)
            _check_int("frames_committed", frames_committed, 0, frames_due)
        self.id = sid
        self.token_hash = token_hash
        self._config = config
        self._scene = scene
        self._epoch = epoch
        self._status: SessionStatus = status
        self._clock = clock
        if log is None:
            log = EventLog(
                EpochStart(config.seed, scene, config.bucket, config.steps), log_capacity, log_frame_bytes
            )
        self.log = log
        self._blocks_committed = blocks_committed
        self._last_block_idx = last_block_idx
        self._frames_due = frames_due
        self._frames_committed = frames_committed
        self.created_at = self.last_seen = self.token_issued_at = clock()
        self._detached_at = self.created_at if status is SessionStatus.DETACHED else math.nan

    @classmethod
    def create(
        cls,
        config: SessionConfig,
        *,
        scene: str = "",
        clock: Clock = time.monotonic,
        log_capacity: int = DEFAULT_CAPACITY,
        log_frame_bytes: int = DEFAULT_FRAME_BYTES,
    ) -> tuple[Session, str]:
        """A new ACTIVE session with a fresh id, and its resume token (returned only here)."""
        token = secrets.token_urlsafe(24)
        session = cls(
            config, hash_token(token), scene=scene, clock=clock, log_capacity=log_capacity,
            log_frame_bytes=log_frame_bytes,
        )
        return session, token

    def __repr__(self) -> str:
        return (
            f"Session(id={self.id!r}, epoch={self._epoch}, status={self._status.value}, "
            f"last_block_idx={self._last_block_idx}, blocks_committed={self._blocks_committed})"
        )

    # Read-only views: state changes only through the methods below.

    @property
    def config(self) -> SessionConfig:
        """The session's configuration."""
        return self._config

    @property
    def scene(self) -> str:
        """The current scene prompt."""
        return self._scene

    @property
    def epoch(self) -> int:
        """Epoch number: 0 for the first, +1 per block_idx 0 on an existing session."""
        return self._epoch

    @property
    def status(self) -> SessionStatus:
        """ACTIVE, DETACHED or CLOSED."""
        return self._status

    @property
    def blocks_committed(self) -> int:
        """Blocks of this epoch the runner finished."""
        return self._blocks_committed

    @property
    def last_block_idx(self) -> int:
        """Newest block accepted in this epoch; -1 before the first."""
        return self._last_block_idx

    @property
    def frames_due(self) -> int:
        """Frames of the accepted blocks."""
        return self._frames_due

    @property
    def frames_committed(self) -> int:
        """Frames of the finished blocks."""
        return self._frames_committed

    @property
    def detached_at(self) -> float:
        """Clock reading at the last detach; nan while not detached."""
        return self._detached_at

    def check_token(self, token: str, max_age_s: float = math.inf) -> bool:
        """True if ``token`` is this session's resume token (constant-time compare) and was
        issued at most ``max_age_s`` ago."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            return False
        fresh = self._clock() - self.token_issued_at <= max_age_s
        return hmac.compare_digest(hash_token(token), self.token_hash) and fresh

    def rotate_token(self) -> str:
        """Replace the resume token (each resume or takeover): the old one no longer
        resumes the session. Returns the new one, shown only here."""
        token = secrets.token_urlsafe(24)
        self.token_hash, self.token_issued_at = hash_token(token), self._clock()
        return token

    def touch(self) -> None:
        """Record client activity."""
        self.last_seen = self._clock()

    def _require(self, action: str, *allowed: SessionStatus) -> None:
        if self._status not in allowed:
            raise IllegalTransition(self.id, self._status.value, action)

    # Status transitions.

    def attach(self) -> None:
        """DETACHED → ACTIVE (a client resumed)."""
        self._require("attach", SessionStatus.DETACHED)
        self._status = SessionStatus.ACTIVE
        self._detached_at = math.nan
        self.touch()

    def detach(self) -> None:
        """ACTIVE → DETACHED (the client went away; resumable until the store's TTL)."""
        self._require("detach", SessionStatus.ACTIVE)
        self._status = SessionStatus.DETACHED
        self._detached_at = self._clock()

    def close(self) -> None:
        """ACTIVE or DETACHED → CLOSED, final. The store calls it before disposing."""
        self._require("close", SessionStatus.ACTIVE, SessionStatus.DETACHED)
        self._status = SessionStatus.CLOSED

    # Blocks.

    def accept_block(self, block_idx: int, frames: int = 1) -> bool:
        """Accept a block request: True if it is the next block, False for a retransmit
        of the last one (no new work). Anything else raises StaleBlock. ACTIVE only."""
        self._require("accept a block for", SessionStatus.ACTIVE)
        last = self._last_block_idx
        if block_idx == last and last >= 0:
            return False
        if block_idx != last + 1:
            raise StaleBlock(self.id, block_idx, last)
        _check_int("frames", frames, 1, 1 << 16)
        self._last_block_idx = block_idx
        self._frames_due += frames
        return True

    def commit_block(self, block_idx: int, frames: int = 1) -> None:
        """The runner finished ``block_idx``; blocks commit in order, once each.
        Allowed while DETACHED too (a chunk in flight when the client left)."""
        self._require("commit a block of", SessionStatus.ACTIVE, SessionStatus.DETACHED)
        done = self._blocks_committed
        if block_idx != done or block_idx > self._last_block_idx:
            raise StaleBlock(self.id, block_idx, done - 1)
        _check_int("frames", frames, 1, self._frames_due - self._frames_committed)
        self._blocks_committed += 1
        self._frames_committed += frames

    def set_scene(self, scene: str) -> bool:
        """Change the scene prompt (the log records it with the first block made with it,
        ``record_block``); False if unchanged."""
        self._require("set the scene of", SessionStatus.ACTIVE, SessionStatus.DETACHED)
        _check_scene(scene)
        if scene == self._scene:
            return False
        self._scene = scene
        return True

    def record_block(self, block_idx: int, applied: Applied, frames: np.ndarray) -> None:
        """Log what a finished block was made with (the scheduler's ``Applied``) and the
        digest of its frames: the replay log (session/eventlog.py)."""
        self.log.record(block_idx, applied, frames)


def _check_scene(scene: object) -> None:
    if not isinstance(scene, str) or len(scene) > MAX_SCENE_CHARS:
        raise ValueError(f"scene must be a str of at most {MAX_SCENE_CHARS} chars")
