"""A fast stand-in for the model runner, for scheduler, engine and server tests.

``FakeRunner`` implements the ``Runner`` protocol (session/plan.py) without a model: each
batch "costs" ``cost(bucket, steps, size)`` seconds, which it can really sleep
(``sleep=time.sleep``), spend on a virtual clock (``sleep=ManualClock().advance``) or
just report. Frames are deterministic: every pixel of frame k of a session holds
``(k % 256, k // 256 % 256, session_tag(session_id))``, where k is the frame's index in the
epoch (block_idx * F + i when every block holds F frames), so a test can read back which
block of which session it got (``decode_frame``). ``first_chunk_frames`` gives block 0 another
frame count, as a latent family's first chunk has.
"""

from __future__ import annotations

import zlib
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from worldserve.session.plan import (
    CONTROLS,
    BatchTiming,
    Capabilities,
    ChunkResult,
    ModelState,
    SessionSpec,
    StepOutput,
    StepPlan,
)

CostFn = Callable[[int, int, int], float]  # (bucket, steps, size) -> seconds


@dataclass(slots=True)
class LinearCost:
    """seconds = (a + b * size) * (steps + 1) / (max_steps + 1), with (a, b) per bucket."""

    coeffs: Mapping[int, tuple[float, float]]
    max_steps: int = 4

    def __call__(self, bucket: int, steps: int, size: int) -> float:
        a, b = self.coeffs[bucket]
        return (a + b * size) * (steps + 1) / (self.max_steps + 1)


def session_tag(session_id: str) -> int:
    """The byte a session's fake frames carry in their third channel."""
    return zlib.crc32(session_id.encode()) % 256


def decode_frame(frame: np.ndarray) -> tuple[int, int]:
    """(frame index mod 65536, session tag) of a fake frame."""
    px = frame[0, 0]
    return int(px[0]) + 256 * int(px[1]), int(px[2])


@dataclass(slots=True)
class _FakeSession:
    bucket: int
    scene: str
    frame_index: int = 0


class FakeRunner:
    """Deterministic, model-free ``Runner``; see the module docstring."""

    def __init__(
        self,
        *,
        buckets: tuple[int, ...] = (64, 128),
        frames_per_chunk: int = 1,
        max_steps: int = 4,
        cost: CostFn | None = None,
        sleep: Callable[[float], None] | None = None,
        frame_side: int | None = 4,
        jitter: float = 0.0,
        seed: int = 0,
        first_chunk_frames: int | None = None,
        controls: tuple[str, ...] = CONTROLS,
        schedules: tuple[tuple[float, ...], ...] = (),
        fps: float | None = None,
    ) -> None:
        self._buckets = buckets
        self._fpc = frames_per_chunk
        self._first = frames_per_chunk if first_chunk_frames is None else first_chunk_frames
        self.controls = controls
        self.schedules, self.fps = schedules, fps  # what ``capabilities`` declares (a trained list, a rate)
        self._max_steps = max_steps
        self.cost: CostFn = cost or LinearCost(
            {b: (0.002 * b / 64, 0.0005 * b / 64) for b in buckets}, max_steps
        )
        self.sleep = sleep
        self.frame_side = frame_side  # side of the fake frames; None: the bucket's size
        self.slowdown = 1.0  # multiplies every cost: simulates drift from the warm-up
        self.jitter = jitter  # each batch's cost times a uniform factor in 1 +- jitter
        self.open_seconds = 0.0  # model time each open takes (a start frame, an observation)
        self._rng = np.random.default_rng(seed)
        self.fail: dict[str, str] = {}  # session id -> error for its next chunk
        self.raise_next: Exception | None = None  # raised by the next execute()
        self.sessions: dict[str, _FakeSession] = {}
        self.batch_sizes: Counter[int] = Counter()
        self.history: deque[tuple[int, int, tuple[str, ...]]] = deque(maxlen=10_000)

    @property
    def buckets(self) -> tuple[int, ...]:
        return self._buckets

    @property
    def frames_per_chunk(self) -> int:
        return self._fpc

    @property
    def first_chunk_frames(self) -> int:
        return self._first

    @property
    def max_steps(self) -> int:
        return self._max_steps

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(first_chunk_frames=self._first, controls=self.controls, schedules=self.schedules,
                            fps=self.fps)

    def batch_run_as(self, bucket: int, steps: int, size: int) -> int:
        return size

    def ready_observation(self, scene: str, seed: int, bucket: int, observation: np.ndarray) -> None:
        return None

    def ready_restore(self, state: ModelState) -> None:
        return None

    def _block_start(self, block_idx: int) -> int:
        return 0 if block_idx == 0 else self._first + (block_idx - 1) * self._fpc

    def execute(self, plan: StepPlan) -> StepOutput:
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        out = StepOutput()
        for sid in plan.freed:
            self.sessions.pop(sid, None)
        for spec in plan.new_sessions:
            self._open(spec, out)
        for upd in plan.updates:
            s = self.sessions.get(upd.session_id)
            if s is None:
                out.errors[upd.session_id] = "update for an unknown session"
                continue
            if upd.bucket is not None:
                s.bucket = upd.bucket
            if upd.scene is not None:
                s.scene = upd.scene
        for batch in plan.batches:
            seconds = self.cost(batch.bucket, batch.steps, len(batch.items)) * self.slowdown
            if self.jitter:
                seconds *= 1 + self.jitter * (2 * self._rng.random() - 1)
            ran = []
            for work in batch.items:
                s = self.sessions.get(work.session_id)
                if s is None:
                    out.errors[work.session_id] = (
                        f"runner has no state for session {work.session_id!r}"
                    )
                elif s.bucket != batch.bucket:
                    out.errors[work.session_id] = (
                        f"session is at bucket {s.bucket}, batch is {batch.bucket}"
                    )
                elif work.session_id in self.fail:
                    out.errors[work.session_id] = self.fail.pop(work.session_id)
                else:
                    frames = self._frames(work.session_id, work.block_idx, batch.bucket)
                    s.frame_index = self._block_start(work.block_idx + 1)
                    out.results.append(
                        ChunkResult(work.session_id, work.block_idx, frames, work.action_seq)
                    )
                    ran.append(work.session_id)
            self.batch_sizes[len(batch.items)] += 1
            self.history.append((batch.bucket, batch.steps, tuple(ran)))
            if self.sleep is not None:
                self.sleep(seconds)
            out.timings.append(BatchTiming(batch.bucket, batch.steps, len(batch.items), seconds))
        return out

    def export_state(self, session_id: str) -> ModelState:
        s = self.sessions[session_id]
        side = self.frame_side or s.bucket
        return ModelState(
            bucket=s.bucket,
            frames=np.zeros((0, side, side, 3), np.uint8),
            sink_count=0,
            frame_index=s.frame_index,
            rng=np.zeros(0, np.uint8),
            scene=s.scene,
        )

    def warmup(self, batch_sizes: tuple[int, ...]) -> list[BatchTiming]:
        """The cost function at every bucket, step count and batch size (no sleeping)."""
        return [
            BatchTiming(b, steps, n, self.cost(b, steps, n) * self.slowdown)
            for b in self._buckets
            for steps in range(1, self._max_steps + 1)
            for n in batch_sizes
        ]

    def first_frame(self, scene: str, seed: int, bucket: int) -> np.ndarray | None:
        return None  # a fake session needs no anchor

    def _open(self, spec: SessionSpec, out: StepOutput) -> None:
        if spec.session_id in self.sessions:
            out.errors[spec.session_id] = "session is already open"
        elif spec.bucket not in self._buckets:
            out.errors[spec.session_id] = f"unknown bucket {spec.bucket}"
        else:
            start = spec.restore.frame_index if spec.restore is not None else 0
            self.sessions[spec.session_id] = _FakeSession(spec.bucket, spec.scene, start)
            if self.sleep is not None and self.open_seconds:
                self.sleep(self.open_seconds)

    def _frames(self, session_id: str, block_idx: int, bucket: int) -> np.ndarray:
        side = self.frame_side or bucket
        n = self._first if block_idx == 0 else self._fpc
        frames = np.empty((n, side, side, 3), np.uint8)
        for i in range(n):
            k = self._block_start(block_idx) + i
            frames[i] = (k % 256, k // 256 % 256, session_tag(session_id))
        return frames
