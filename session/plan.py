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

Model families differ in shape; the contract says how, in optional runner members that
``session.options.RunnerInfo.of`` reads (a runner without them serves what the default
family serves):

- Resolution. A bucket stays one integer, the key of the scheduler's batches and of the
  ladder's resolution rung; ``frame_size(bucket) -> (height, width)`` says the frames it
  makes (default: square, ``(bucket, bucket)``). Wan's bucket 480 makes 480x832 frames.
- Frames per block. Block 0 of an epoch holds ``first_chunk_frames`` frames, every later
  block ``frames_per_chunk`` (default: the same). A causal VAE's first chunk decodes to
  fewer frames (Wan: 3 latent frames make 9 pixel frames first, then 12). A restored
  session goes on at a block > 0, so its next block holds ``frames_per_chunk``.
- Controls. ``controls`` names what the family takes, a subset of ``CONTROLS``; a
  text-only family says ``("prompt",)`` and ignores the actions it is given.
- Model state. ``ModelState`` carries pixel frames (the default family) or latent frames
  (``latents``, a latent family such as Wan), and the ``family`` that made it; a family
  that can be restored exactly adds a ``Continuation`` (its cache and what shapes the next
  frames besides); a family steered by past actions adds an ``ActionTrace``.
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
class CanvasState:
    """A session's world canvas (model/default/reference/canvas/canvas.py): ``keys`` (N, 2) int32 tile keys,
    ``codes`` (N, TILE, TILE) uint16 ground codes (0xFFFF where none is written yet),
    ``position`` (2,) float64 the view's top-left in world units, ``seed`` the prior's;
    ``seen_keys`` (M, 2) int32 and ``seen`` (M, 4, 64, 64) uint8: the pixels observations
    showed, per tile (colours, then a weight in 255ths; model/default/reference/canvas/seen.py), or None."""

    keys: np.ndarray
    codes: np.ndarray
    position: np.ndarray
    seed: int
    seen_keys: np.ndarray | None = None
    seen: np.ndarray | None = None


@dataclass(slots=True)
class Continuation:
    """What a session's next frames depend on beyond its clean frames, as the source runner
    holds it, so that a restored session goes on bit for bit as the undisturbed one would.

    The clean frames of ``ModelState`` are rounded to uint8 and the keys/values of a window
    frame were computed against context that has since rolled out of the window, so a
    re-cache from the frames alone is close, not exact. A family that exports this (the
    default family does) restores from it instead; all arrays are float32, exact copies of
    the model's floats (a bf16 runner's values widen and narrow back without change).

    ``kv``: (2, L, N, T, H, D) keys (rotated in space) and values of the N cached frames in
    ``ModelState.frames`` order (sinks first, then the window oldest first), L layers, T
    tokens a frame, H heads of D. ``prev``: the last clean frame (C, H, W). The anchor
    reference (model/default/reference/anchor.py): ``anchor`` (C, H, W) or None,
    ``anchor_offset`` (2,) the camera shift summed since it, ``anchor_wait`` frames still to
    wait before re-anchoring when there is none, ``anchor_age`` frames since it. ``canvas``:
    the session's world canvas where its runner keeps one, else None.
    """

    kv: np.ndarray
    prev: np.ndarray
    anchor: np.ndarray | None = None
    anchor_offset: np.ndarray | None = None
    anchor_wait: int = 0
    anchor_age: int = 0
    canvas: CanvasState | None = None


@dataclass(slots=True)
class ActionTrace:
    """The per-frame actions a steered family's next frames still read, and where its anchor
    sits, so that a restore re-caches the window under the actions it was made with.

    Matrix-Game's action modules read, for each latent frame, a window of the pixel frames'
    actions before it (12 of them), and the keys and values its cache holds were computed
    under those actions; its image condition counts frames from the anchor image. Without
    this a restored session re-caches with nothing held, counting from frame 0.

    ``keyboard`` (N, K) and ``mouse`` (N, M) float32: the family's own action space (the
    server's action vectors as the family maps them; M may be 0), one row a pixel frame,
    rows of pixel frames ``first`` .. ``first + N - 1`` counted from the anchor (the model's
    frame 0). ``anchor_frame``: the epoch frame (latent frame, for a latent family) that is
    the anchor's model frame 0.
    """

    keyboard: np.ndarray
    mouse: np.ndarray
    first: int = 0
    anchor_frame: int = 0


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

    ``continuation``, where the family exports one, makes the restore exact (see
    ``Continuation``); without it the target rebuilds the cache from the frames or latents.
    ``actions``, where the family is steered by past actions (see ``ActionTrace``), lets that
    rebuild run under the actions the frames were made with.
    """

    bucket: int
    frames: np.ndarray
    sink_count: int
    frame_index: int
    rng: np.ndarray
    scene: str
    latents: np.ndarray | None = None
    family: str = "default"
    continuation: Continuation | None = None
    actions: ActionTrace | None = None


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


class Runner(Protocol):
    """What the engine needs from a model runner. The families' runners
    (``model/default/runner.py``, ``model/wan/runner.py``) are the real ones;
    ``session.fake_runner.FakeRunner`` stands in for scheduler tests.

    Optional members (see the module docstring; ``RunnerInfo.of`` supplies the defaults):
    ``first_chunk_frames: int`` (frames of block 0), ``frame_size(bucket) -> (height,
    width)``, ``controls: tuple[str, ...]`` (a subset of ``CONTROLS``) and
    ``batch_run_as(bucket, steps, size) -> int`` (the batch size a batch of ``size`` chunks
    really runs as, for a runner that pads batches to a few recorded shapes; warm-up times
    it so), ``ready_observation(scene, seed, bucket, frame) -> None`` (thread-safe: a
    server calls it off the model thread with a start's observation before the session
    opens, so the runner can do its work on that frame there) and ``ready_restore(state) ->
    None`` (thread-safe: a server calls it off the model thread with the snapshot a session
    is about to be restored from, before it schedules the session)."""

    @property
    def buckets(self) -> tuple[int, ...]: ...

    @property
    def frames_per_chunk(self) -> int: ...

    @property
    def max_steps(self) -> int: ...

    def execute(self, plan: StepPlan) -> StepOutput: ...

    def export_state(self, session_id: str) -> ModelState: ...

    def warmup(self, batch_sizes: tuple[int, ...]) -> list[BatchTiming]: ...

    def first_frame(self, scene: str, seed: int, bucket: int) -> np.ndarray | None:
        """The (height, width, 3) uint8 frame a fresh session with no observation is
        anchored on, or None (it starts from nothing). Safe to call off the model thread: a
        server renders it there and passes it as ``SessionSpec.observation``, so opening a
        session does not hold up the chunks of the running ones."""
        ...
