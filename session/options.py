"""The scheduler's configuration: session modes, what it knows of the runner, its knobs.

``SchedulerOptions`` holds the scheduler's own knobs and nests the degradation
controller's (``DegradeOptions``, session/degrade.py) and admission's
(``AdmissionOptions``, session/admission.py); ``server/settings.py`` builds it from the
server's settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from worldserve.session.admission import AdmissionOptions
from worldserve.session.degrade import DegradeOptions
from worldserve.session.plan import CONTROLS, Runner

DEFAULT_FPS = 24.0  # a session's frame rate where neither its client nor the model names one


class Mode(StrEnum):
    PUSH = "push"  # the server paces frames on the session's frame clock
    PULL = "pull"  # the client asks for each block (lockstep)


@dataclass(frozen=True, slots=True)
class RunnerInfo:
    """What the scheduler (and the server) need to know about the runner: its members and
    its declared ``Capabilities`` (session/plan.py), defaults filled in."""

    buckets: tuple[int, ...]
    frames_per_chunk: int  # frames of every block after an epoch's first
    max_steps: int
    batch_sizes: tuple[int, ...]  # warmed batch sizes; the largest caps a batch
    first_chunk_frames: int = 0  # frames of block 0 of an epoch; 0: frames_per_chunk
    sizes: tuple[tuple[int, int], ...] = ()  # (height, width) per bucket, in bucket order; (): square
    controls: tuple[str, ...] = CONTROLS  # what the model takes
    step_counts: tuple[int, ...] = ()  # the step counts the model was trained for; (): 1..max_steps
    schedules: tuple[tuple[float, ...], ...] = ()  # their model timesteps, in the same order (Capabilities)
    steps_cost: bool = True  # False: a chunk costs the same at any step count
    fps: float = DEFAULT_FPS  # a session's frame rate when its client names none
    recipe: str | None = None  # the published recipe a checkpoint family serves, by name

    def __post_init__(self) -> None:
        if not self.buckets or not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"need buckets and batch sizes >= 1, got {self}")
        if self.frames_per_chunk < 1 or self.first_chunk_frames < 0:
            raise ValueError(
                f"need frames_per_chunk >= 1 and first_chunk_frames >= 0, got "
                f"{self.frames_per_chunk!r} and {self.first_chunk_frames!r}"
            )
        if self.sizes and len(self.sizes) != len(self.buckets):
            raise ValueError(f"sizes {self.sizes} must give one (height, width) per bucket {self.buckets}")
        if self.step_counts and (max(self.step_counts) != self.max_steps or min(self.step_counts) < 1):
            raise ValueError(f"step_counts {self.step_counts} must be in 1..max_steps {self.max_steps} and hold it")
        if not self.fps > 0:
            raise ValueError(f"fps must be > 0, got {self.fps!r}")
        unknown = sorted(set(self.controls) - set(CONTROLS))
        if unknown:
            raise ValueError(f"unknown controls {unknown}; known: {list(CONTROLS)}")

    @classmethod
    def of(cls, runner: Runner, batch_sizes: tuple[int, ...], buckets: tuple[int, ...] | None = None) -> RunnerInfo:
        """The runner's info, serving ``buckets`` (default: all of the runner's)."""
        buckets = tuple(runner.buckets) if buckets is None else buckets
        caps = runner.capabilities
        sizes = tuple(caps.frame_sizes.get(b, (b, b)) for b in buckets) if caps.frame_sizes else ()
        first = caps.first_chunk_frames or runner.frames_per_chunk
        counts = tuple(len(ts) for ts in caps.schedules)
        return cls(buckets, runner.frames_per_chunk, runner.max_steps, batch_sizes, first, sizes, caps.controls,
                   counts, caps.schedules, caps.steps_cost, caps.fps or DEFAULT_FPS,
                   str(caps.recipe["name"]) if caps.recipe and caps.recipe.get("name") else None)

    def schedule(self, steps: int) -> tuple[float, ...]:
        """The model timesteps a session at ``steps`` runs; () where the runner does not say."""
        return self.schedules[self.step_counts.index(steps)] if steps in self.step_counts else ()

    def frames_in_block(self, block_idx: int) -> int:
        """How many frames block ``block_idx`` of an epoch holds."""
        if block_idx == 0 and self.first_chunk_frames:
            return self.first_chunk_frames
        return self.frames_per_chunk

    def block_start(self, block_idx: int) -> int:
        """The epoch frame index of block ``block_idx``'s first frame."""
        if block_idx <= 0:
            return 0
        return self.frames_in_block(0) + (block_idx - 1) * self.frames_per_chunk

    def frame_size(self, bucket: int) -> tuple[int, int]:
        """(height, width) of the frames of ``bucket``."""
        if not self.sizes:
            return bucket, bucket
        return self.sizes[self.buckets.index(bucket)]


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
