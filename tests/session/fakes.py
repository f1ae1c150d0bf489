"""Test doubles shared by the session tests."""

from __future__ import annotations

import numpy as np

from worldserve.session.eventlog import Applied
from worldserve.session.plan import ACTION_DIM, ModelState


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


class DisposeRecorder:
    """An ``on_dispose`` hook that counts disposals per session object."""

    def __init__(self) -> None:
        self.calls: list[object] = []

    def __call__(self, session: object) -> None:
        self.calls.append(session)

    def count(self, session: object) -> int:
        return sum(1 for s in self.calls if s is session)


def action(*values: float) -> np.ndarray:
    vec = np.zeros(ACTION_DIM, dtype=np.float32)
    vec[: len(values)] = values
    return vec


def applied(vec: np.ndarray, seq: int, *, bucket: int = 64, steps: int = 4,
            scene: str | None = None, observations: tuple[np.ndarray, ...] = ()) -> Applied:
    """What the scheduler reports a one-frame block was made with."""
    return Applied(bucket, steps, vec[None, :], seq, scene, observations)


def model_state(bucket: int = 8, frames: int = 3, scene: str = "s") -> ModelState:
    rng = np.random.default_rng(0)
    return ModelState(
        bucket=bucket,
        frames=rng.integers(0, 256, size=(frames, bucket, bucket, 3), dtype=np.uint8),
        sink_count=1,
        frame_index=frames,
        rng=rng.integers(0, 256, size=32, dtype=np.uint8),
        scene=scene,
    )
