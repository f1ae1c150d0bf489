"""The scheduler's configuration: session modes, what it knows of the runner, its knobs.

``SchedulerOptions`` holds the scheduler's own knobs and nests the degradation
controller's (``DegradeOptions``, session/degrade.py) and admission's
(``AdmissionOptions``, session/admission.py); ``server/settings.py`` builds it from the
server's settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from session.admission import AdmissionOptions
from session.degrade import DegradeOptions
from session.plan import Runner


class Mode(StrEnum):
    PUSH = "push"  # the server paces frames on the session's frame clock
    PULL = "pull"  # the client asks for each block (lockstep)


@dataclass(frozen=True, slots=True)
class RunnerInfo:
    """What the scheduler needs to know about the runner."""

    buckets: tuple[int, ...]
    frames_per_chunk: int
    max_steps: int
    batch_sizes: tuple[int, ...]  # warmed batch sizes; the largest caps a batch

    def __post_init__(self) -> None:
        if not self.buckets or not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"need buckets and batch sizes >= 1, got {self}")

    @classmethod
    def of(cls, runner: Runner, batch_sizes: tuple[int, ...]) -> RunnerInfo:
        return cls(tuple(runner.buckets), runner.frames_per_chunk, runner.max_steps, batch_sizes)


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    batch_window: float = 0.010  # seconds: chunks due this close to a batch's lead join it
    release_ahead: float = 1.0  # chunk periods before its due time a push chunk may start
    margin: float = 0.002  # seconds kept free before a display time (encode, send)
    start_delay: float | None = None  # first chunk due this long after add; None: one period
    pull_deadline: float = 0.25  # seconds a pull request may take when the client names none
    pull_queue: int = 8  # most outstanding pull requests per session
    min_steps: int = 2  # the ladder's floor for denoising steps
    min_fps: float = 12.0  # the ladder's floor for frame rate
    control_interval: float = 0.25  # seconds between degradation decisions
    batching: bool = True  # False: every session is stepped alone (for comparison)
    align_phase: bool = True  # new push clocks start in phase with running ones (<= 1 period later)
    degrade: DegradeOptions = field(default_factory=DegradeOptions)
    admission: AdmissionOptions = field(default_factory=AdmissionOptions)
