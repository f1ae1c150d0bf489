"""The contract between the scheduler (``session/``) and the model runner (``model/``).

The engine step is three moves::

    plan = scheduler.schedule(now)     # session/: what to generate, for whom
    out = runner.execute(plan)         # model/:   tensors, KV cache slots, decoding
    scheduler.update(plan, out)        # session/: fold results back into the counters

Only the plain dataclasses below cross the boundary (numpy arrays inside, no torch).
A plan carries the full data of a new session once (``SessionSpec``), then only what
changed (``SessionUpdate``), the chunks to generate (``Batch`` of ``ChunkWork``) and the
ids whose model state must be freed.

Physical state (KV cache slots, clean-frame windows, RNG) lives in the runner, keyed by
session id; ``Runner.export_state`` / ``SessionSpec.restore`` move it between workers as
a ``ModelState`` of plain arrays.

Model families differ in shape; a runner declares how in one place, its ``capabilities``
(``Capabilities``), which ``session.options.RunnerInfo.of`` reads:

- Resolution. A bucket stays one integer, the key of the scheduler's batches and of the
  ladder's resolution rung; ``frame_sizes`` says the frames each makes (default: square,
  ``(bucket, bucket)``). Wan's bucket 480 makes 480x832 frames.
- Frames per block. Block 0 of an epoch holds ``first_chunk_frames`` frames, every later
  block ``frames_per_chunk`` (default: the same). A causal VAE's first chunk decodes to
  fewer frames (Wan: 3 latent frames make 9 pixel frames first, then 12). A restored
  session goes on at a block > 0, so its next block holds ``frames_per_chunk``.
- Controls. ``controls`` names what the family takes, a subset of ``CONTROLS``; a
  text-only family says ``("prompt",)`` and ignores the actions it is given.
- Steps and rate. ``schedules`` names the step lists a few-step student was trained for (the
  ladder picks among them only); ``steps_cost`` False says a chunk costs the same at any step
  count; ``fps`` is the rate its frames play at, a session's default when its client names none.
- Model state. ``ModelState`` carries pixel frames (the default family) or latent frames
  (``latents``, a latent family such as Wan), the ``family`` that made it and the family's
  own state as named arrays (``family_state``), which only the family reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

# The action vocabulary is the wire's, defined in protocol/vocab.py and part of this
# contract too: keys in the order of the multi-hot action vector
# ``[*keys, mouse_dx, mouse_dy]`` (ACTION_DIM floats a frame), the controls a family takes.
from worldserve.protocol.vocab import ACTION_DIM as ACTION_DIM
from worldserve.protocol.vocab import CONTROLS as CONTROLS
from worldserve.protocol.vocab import KEYS as KEYS
from worldserve.protocol.vocab import MOUSE_DIMS as MOUSE_DIMS
from worldserve.protocol.vocab import encode_action as encode_action


@dataclass(slots=True)
class ModelState:
    """The compact model-side state of one session, enough to rebuild its KV cache.

    ``frames``: the committed clean frames still in the cache (sink frames first, then
    the window, oldest first), (N, H, W, 3) uint8. ``frame_index``: the index of the next
    frame to generate. ``rng``: the session's noise generator state as uint8 bytes.

    A latent family (``family`` other than "default") keeps its window as ``latents``
    instead, (N, C, h, w) float32, sink frames first, with ``frames`` empty,
    (0, height, width, 3), or holding the image the family is anchored on (Matrix-Game),
    (1, height, width, 3): ``sink_count`` and ``frame_index`` then count latent frames.
    The target worker re-runs the commit pass over them to rebuild the KV cache.

    ``family_state``: the family's own state beside its frames, named arrays that the family
    packs and checks itself (``family_state.py`` checks only their envelope: names, dtypes,
    ranks and sizes). The default family keeps its cache's keys and values and what its
    reference holds there, so a restore is exact; Matrix-Game the actions its window was made
    with; empty: the target rebuilds the cache from the frames or latents alone.
    """

    bucket: int
    frames: np.ndarray
    sink_count: int
    frame_index: int
    rng: np.ndarray
    scene: str
    latents: np.ndarray | None = None
    family: str = "default"
    family_state: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(slots=True)
class SessionSpec:
    """Everything the runner needs to open a session's model state, sent once."""

    session_id: str
    bucket: int  # one of the runner's buckets (frames of ``frame_size(bucket)``)
    seed: int
    scene: str  # scene prompt text; the runner maps it to a conditioning vector
    observation: np.ndarray | None = None  # (H, W, 3) uint8 first frame to anchor on
    restore: ModelState | None = None  # rebuild from a snapshot instead of starting fresh


@dataclass(slots=True)
class SessionUpdate:
    """A change to a running session's model state, applied before the plan's batches."""

    session_id: str
    scene: str | None = None  # new prompt: re-cache the window with the new scene
    bucket: int | None = None  # new resolution bucket: re-cache the window at that size
    observation: np.ndarray | None = None  # a real frame to commit into the cache


@dataclass(slots=True)
class ChunkWork:
    """One chunk of one session: generate it with these actions, then commit it."""

    session_id: str
    block_idx: int  # per-epoch chunk counter, as the client sees it
    actions: np.ndarray  # (frames_per_chunk, ACTION_DIM) float32
    action_seq: int = 0  # sequence number of the latest action folded into ``actions``


@dataclass(slots=True)
class Batch:
    """Chunks that share a compatibility key and run as one forward per denoising step."""

    bucket: int
    steps: int  # denoising steps for every chunk of the batch
    items: list[ChunkWork]
    deadline: float = float("inf")  # earliest member's deadline (scheduler clock)


@dataclass(slots=True)
class StepPlan:
    new_sessions: list[SessionSpec] = field(default_factory=list)
    updates: list[SessionUpdate] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    freed: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.new_sessions or self.updates or self.batches or self.freed)


@dataclass(slots=True)
class ChunkResult:
    session_id: str
    block_idx: int
    frames: np.ndarray  # (frames in the block, H, W, 3) uint8
    action_seq: int = 0


@dataclass(slots=True)
class BatchTiming:
    bucket: int
    steps: int
    size: int  # number of chunks in the batch
    seconds: float  # wall time of the whole chunk (all steps + commit + decode)


@dataclass(slots=True)
class StepOutput:
    results: list[ChunkResult] = field(default_factory=list)
    timings: list[BatchTiming] = field(default_factory=list)
    # Per-session failures (bad observation, unknown id, ...): the session gets an
    # error, the rest of the plan still ran.
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a runner declares beside the members every runner has (see the module's doc)."""

    first_chunk_frames: int = 0  # frames of block 0 of an epoch; 0: ``frames_per_chunk``
    frame_sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # (h, w) by bucket; absent: square
    controls: tuple[str, ...] = CONTROLS  # what the family takes, a subset of ``CONTROLS``
    # ``Runner.ready_observation`` / ``ready_restore`` do work worth a worker thread: a server
    # calls them there before a session opens or is restored (otherwise they do nothing)
    ready_observation: bool = False
    ready_restore: bool = False
    dtype: str = "float32"  # the float type the model runs in
    reference: str = ""  # what the model reads beside its cache ("anchor", "canvas"; "": nothing)
    recipe: dict[str, object] | None = None  # the published recipe a checkpoint family serves
    # the model timesteps of each step list the model was trained for, most steps first: the ladder
    # visits only their step counts; (): every count from 1 to ``max_steps`` (the default family)
    schedules: tuple[tuple[float, ...], ...] = ()
    steps_cost: bool = True  # False: a chunk costs the same at any step count (Rolling Forcing)
    fps: float | None = None  # the frame rate the model's frames play at: sessions' default (None: 24)


class Runner(Protocol):
    """What the engine needs from a model runner. The families' runners
    (``model/default/runner.py``, ``model/wan/runner.py``) are the real ones;
    ``session.fake_runner.FakeRunner`` stands in for scheduler tests.

    ``capabilities`` declares how the family differs (``Capabilities``). ``batch_run_as``
    gives the batch size a batch of ``size`` chunks really runs as (a runner that pads
    batches to a few recorded shapes says so; warm-up times it so). ``ready_observation``
    and ``ready_restore`` are thread-safe: a server calls them off the model thread, with a
    start's observation before the session opens and with the snapshot a session is about
    to be restored from before it is scheduled, so the runner can do its work there."""

    @property
    def buckets(self) -> tuple[int, ...]: ...

    @property
    def frames_per_chunk(self) -> int: ...

    @property
    def max_steps(self) -> int: ...

    def execute(self, plan: StepPlan) -> StepOutput: ...

    def export_state(self, session_id: str) -> ModelState: ...

    def warmup(self, batch_sizes: tuple[int, ...]) -> list[BatchTiming]: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def batch_run_as(self, bucket: int, steps: int, size: int) -> int: ...

    def ready_observation(self, scene: str, seed: int, bucket: int, observation: np.ndarray) -> None: ...

    def ready_restore(self, state: ModelState) -> None: ...

    def first_frame(self, scene: str, seed: int, bucket: int) -> np.ndarray | None:
        """The (height, width, 3) uint8 frame a fresh session with no observation is
        anchored on, or None (it starts from nothing). Safe to call off the model thread: a
        server renders it there and passes it as ``SessionSpec.observation``, so opening a
        session does not hold up the chunks of the running ones."""
        ...
