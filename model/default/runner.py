"""The model runner: executes a ``StepPlan`` (session/plan.py) on the world model.

It owns the physical state of every session, keyed by session id: a KV cache slot in the pool
of the session's bucket, the previous clean frame, the clean frames still in the cache (for
re-caching and snapshots), the scene vector and a private noise generator.

A batch runs as one forward per denoising step for all its sessions (stacked on the batch
axis, each with its own slot, actions and noise), then one commit forward writing the clean
chunk into each slot. One thread owns a runner: it is not thread-safe.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.default.chunk_graph import ChunkGraphs
from worldserve.model.default.frames import resize_frames
from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.reference.anchor import AnchorReference, clamped_actions
from worldserve.model.default.reference.base import Reference
from worldserve.model.default.reference.canvas.ground import TRUST, GroundPainter
from worldserve.model.default.reference.canvas.reference import CanvasReference
from worldserve.model.default.reference.canvas.tile_decode import SHARPEN, beside_chunks
from worldserve.model.default.reference.live.bank import LiveBank
from worldserve.model.default.reference.live.reference import LiveReference
from worldserve.model.default.reference.start_views import Views
from worldserve.model.default.slot import (
    SessionSlot,
    cached_ids,
    export_cache,
    install_cache,
    reseed,
)
from worldserve.model.default.trace_cache import gather_traces
from worldserve.model.default.weights import DEFAULT_WEIGHTS, LIVE_PARTS, config_path, load_model
from worldserve.model.dtype import pick_dtype
from worldserve.model.memory import tune_malloc
from worldserve.model.plan_walk import deliver, prepare, session_state
from worldserve.session.plan import (
    Batch,
    BatchTiming,
    Capabilities,
    ChunkWork,
    ModelState,
    SessionSpec,
    SessionUpdate,
    StepOutput,
    StepPlan,
)
from worldserve.session.warmup import warm_up
from worldserve.world.scene import parse_prompt

log = logging.getLogger(__name__)

SceneEncoder = Callable[[str], np.ndarray]
StartFrame = Callable[[str, int, int], np.ndarray]  # (scene, seed, bucket) -> (bucket, bucket, 3) uint8


def default_scene_encoder(text: str) -> np.ndarray:
    return parse_prompt(text).to_vector()


class ModelRunner:
    def __init__(
        self,
        model: WorldModel,
        *,
        max_sessions: int = 32,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        scene_encoder: SceneEncoder = default_scene_encoder,
        start_frame: StartFrame | None = None,
        graphs: bool = False,
        trace: bool = False,
        trace_cache: Path | None = None,
        ground: GroundPainter | None = None,
        start_views: Views | None = None,
        live: LiveBank | None = None,
    ):
        """``start_frame``: the first frame of a session that starts with neither an
        observation nor a snapshot (the default model renders its world's view there);
        without one such a session starts from an all-zero previous frame. ``graphs``:
        run one-frame chunks past the sink from fixed buffers (``model/default/chunk_graph.py``),
        captured and replayed as CUDA graphs on a GPU (``bench.gpu_check`` holds the replay to
        the eager path there). ``trace``: on the CPU, the same chunks run as TorchScript traces,
        with the GIL released (the event loop's Python no longer stalls them) and no Python
        between kernels; ``graphs`` alone runs their buffers eagerly there (the tests).
        ``trace_cache``: a directory keeping recorded traces between starts (``trace_cache``).
        ``ground``: keep a world canvas per session and take every frame's reference from it
        (``reference/canvas/``) instead of the anchor (``reference/anchor.py``);
        ``start_views``, a fresh session's view and the ground under it, written into its
        canvas (``reference/start_views.py``). ``live``: with ``ground``, keep each session's live
        state too (what moves, ``reference/live/``), sampled from this bank, and hand it to the
        network as channels after the reference (weights with ``state_channels``)."""
        tune_malloc()  # reuse freed tensor memory: no page faults per chunk (model/memory.py)
        self.cfg: ModelConfig = model.cfg
        self.device = torch.device(device)
        self.dtype = dtype
        self.model = model.to(self.device, dtype).eval()
        self.model.shift_head.float()  # summed over many frames: the shift per action stays fp32
        self.scene_encoder = scene_encoder
        self.pools = {
            b: KVCachePool.create(self.cfg, b, max_sessions, model.rope, dtype, self.device)
            for b in self.cfg.buckets
        }
        self.sessions: dict[str, SessionSlot] = {}
        # room for every shape a chunk can take (buckets x step counts x batch sizes x cache
        # filling or full), so a server that warmed them all never captures one again
        shapes = len(self.cfg.buckets) * self.cfg.denoising_steps * max_sessions * 2
        on = graphs or (trace and self.device.type == "cpu")
        self.graphs = ChunkGraphs(self.model, dtype, self.device, limit=shapes, trace=trace) if on else None
        self.trace_cache = trace_cache
        shift = self.model.camera_shift
        self.ref: Reference = (AnchorReference(self.cfg, shift, self.device, dtype) if ground is None
                               else CanvasReference(ground, shift, self.device))
        if (live is not None) != bool(self.cfg.state_channels) or (live is not None and ground is None):
            raise ValueError(f"a live state needs a canvas and weights with state channels (live={live is not None}, "
                             f"canvas={ground is not None}, state_channels={self.cfg.state_channels})")
        if live is not None:
            self.ref = LiveReference(CanvasReference(ground, shift, self.device), live)  # type: ignore[arg-type]
        self.starts = self.ref.start_views(start_frame, start_views)

    @classmethod
    def from_pretrained(
        cls, path: str | Path = DEFAULT_WEIGHTS, *, threads: int | None = None,
        dtype: torch.dtype | str = torch.float32,
        sampler: dict[str, float] | None = None, canvas: bool = False, canvas_decode: str = "between",
        tokenizer: Path | None = None, canvas_trust: float = TRUST, canvas_sharpen: float = SHARPEN,
        canvas_live: bool = False, live_parts: Path | None = None, **kw: object,
    ) -> ModelRunner:
        """Load weights; the default model (trained on ``world/``) starts sessions from its world's
        view unless ``start_frame`` is given (``None`` turns that off). ``dtype`` may be a name for
        ``model.dtype.pick_dtype`` ("auto": bf16 on a GPU, and on a CPU with bf16 matrix
        instructions). ``sampler`` overrides the weights' sampler settings (``ModelConfig.with_sampler``).
        ``canvas``: the world canvas (``ground.py``), tiles decoded ahead ``canvas_decode`` chunks (``tile_decode``),
        its ground ``tokenizer`` (default: committed), ``canvas_trust`` the ``reference_trust`` (0: as learnt),
        ``canvas_sharpen`` the unsharp mask on its tiles (``tile_decode.sharpen``; 0: none).
        ``canvas_live``: with ``canvas``, the live state of what moves (``reference/live/``;
        weights with state channels of their own, e.g. a ``training.live`` export, or ``live_parts``
        laid on weights without: by default the committed ``weights.LIVE_PARTS``)."""
        if threads is not None:
            torch.set_num_threads(threads)
        device = kw.get("device", "cpu")
        assert isinstance(device, (str, torch.device))
        kw["dtype"] = pick_dtype(dtype, device=device) if isinstance(dtype, str) else dtype
        if "start_frame" not in kw and (canvas_live or Path(path).resolve() == Path(DEFAULT_WEIGHTS).resolve()):
            # the default family's start frame comes from its world
            from worldserve.world import start_frame

            kw["start_frame"] = start_frame
            if canvas:
                from worldserve.world import start_views

                kw.setdefault("start_views", start_views)
        if canvas:
            beside = beside_chunks(canvas_decode, torch.device(device), kw["dtype"])  # type: ignore[arg-type]
            paint = {"tokenizer": tokenizer} if tokenizer is not None else {}
            kw["ground"] = GroundPainter.load(torch.device(device), dtype=kw["dtype"], beside_chunks=beside,
                                             sharpen=canvas_sharpen, **paint)
            if canvas_live:
                kw["live"] = LiveBank.load()
        if canvas_live and not ModelConfig.from_json(config_path(path).read_text()).state_channels:
            live_parts = live_parts or LIVE_PARTS
        model = load_model(path, live_parts=live_parts if canvas_live else None)
        model.cfg = model.cfg.with_sampler({**({"reference_trust": canvas_trust} if canvas else {}), **(sampler or {})})
        return cls(model, **kw)  # type: ignore[arg-type]

    # --- the Runner protocol ---

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.cfg.buckets

    @property
    def frames_per_chunk(self) -> int:
        return self.cfg.frames_per_chunk

    @property
    def max_steps(self) -> int:
        return self.cfg.denoising_steps

    @property
    def ground(self) -> GroundPainter | None:
        """The world canvas's painter, where the runner keeps one (benches read its decoder)."""
        return self.ref.painter if isinstance(self.ref, CanvasReference | LiveReference) else None

    @property
    def capabilities(self) -> Capabilities:
        canvas = self.ref.kind == "canvas"
        return Capabilities(ready_observation=canvas and self.starts is not None, ready_restore=canvas,
                            dtype=str(self.dtype).removeprefix("torch."), reference=self.ref.kind)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput:
        out = StepOutput()
        prepare(plan, out, self.free, self._open, self._update)
        for batch in plan.batches:
            items = [it for it in batch.items if self._runnable(out, it, batch)]
            if not items:
                continue
            t0 = time.perf_counter()
            frames = self._run_chunk(batch.bucket, batch.steps, items)
            deliver(out, batch.bucket, batch.steps, items, frames, time.perf_counter() - t0)
        return out

    def batch_run_as(self, bucket: int, steps: int, size: int) -> int:
        """The batch size a steady-state batch of ``size`` chunks runs as: where chunks run as graphs
        or traces, the smallest recorded for its bucket and step count that holds it (``chunk_graph.py``)."""
        return size if self.graphs is None else self.graphs.run_as(bucket, steps, size)

    def export_state(self, session_id: str) -> ModelState:
        """The session's compact state, with its family state (``slot.py``): restored from
        it, the session makes exactly the frames it would have made here."""
        s = self._get(session_id)
        frames = [*s.sinks, *s.window]
        empty = np.zeros((0, s.bucket, s.bucket, 3), np.uint8)
        return ModelState(
            bucket=s.bucket,
            frames=np.stack(frames) if frames else empty,
            sink_count=len(s.sinks),
            frame_index=s.frame_index,
            rng=s.gen.get_state().numpy().copy(),
            scene=s.scene_text,
            family_state={**export_cache(self.cfg, self.pools[s.bucket], s), **self.ref.export(s.ref)},
        )

    def first_frame(self, scene: str, seed: int, bucket: int) -> np.ndarray | None:
        """``start_frame``'s view for a fresh session (None without one); thread-safe."""
        self.cfg.check_bucket(bucket)
        return None if self.starts is None else self.starts.frame(scene, seed, bucket)

    def ready_observation(self, scene: str, seed: int, bucket: int, observation: np.ndarray) -> None:
        """A client's observation a session is about to start on (thread-safe, for a worker
        thread): with a canvas, its ground is made from it now (``GroundPainter.ready``) and
        the session opens on it, as on ``first_frame``'s."""
        self.cfg.check_bucket(bucket)
        if observation.dtype != np.uint8 or observation.ndim != 3 or observation.shape[2] != 3:
            return  # refused with a clear error when the session opens (``_observe``)
        if self.starts is not None and self.ref.kind == "canvas":
            self.starts.keep_observation(scene, seed, bucket, observation)

    def ready_restore(self, state: ModelState) -> None:
        """A snapshot a session is about to be restored from (thread-safe, for a worker
        thread): with a canvas, it is rebuilt and its first tiles decoded now, and the
        restore adopts it (``restores.py``)."""
        self.ref.ready_restore(state)

    def prepare_shapes(self, shapes: list[tuple[int, int, int]]) -> None:
        """Before a warm-up of ``shapes`` ((bucket, steps, batch size)): with CPU traces, load
        every steady-state trace the cache holds (``trace_cache``) and record the others in
        child processes (``trace_recorder``: this process keeps the traces, not the 40-100 MB
        each recording leaves behind), keeping them in the cache; the warm-up then runs them.
        Should a child fail, the warm-up records those here as it runs."""
        if self.graphs is not None and self.graphs.mode == "trace" and self.cfg.frames_per_chunk == 1:
            gather_traces(self.graphs, self.model, self.dtype, self.trace_cache, shapes)

    @torch.inference_mode()
    def warmup(self, batch_sizes: tuple[int, ...]) -> list[BatchTiming]:
        """Run and time every (bucket, step count, batch size) on throwaway sessions."""
        steps = tuple(range(self.cfg.min_steps, self.cfg.denoising_steps + 1))
        return warm_up(self, self.cfg.buckets, steps, batch_sizes)

    # --- session state ---

    def free(self, session_id: str) -> None:
        s = self.sessions.pop(session_id, None)
        if s is not None:
            self.pools[s.bucket].release(s.slot)
            self.ref.release(s.ref)

    def _open(self, spec: SessionSpec) -> None:
        if spec.session_id in self.sessions:
            self.free(spec.session_id)  # a new epoch replaces the old state
        self.cfg.check_bucket(spec.bucket)
        gen = torch.Generator(self.device).manual_seed(spec.seed)
        slot = self.pools[spec.bucket].allocate()
        c, b = self.cfg.channels, spec.bucket
        s = SessionSlot(
            bucket=b, slot=slot, frame_index=0,
            prev=torch.zeros(c, b, b, dtype=self.dtype, device=self.device),
            scene_text=spec.scene, scene=self._scene(spec.scene), gen=gen,
            ref=self.ref.open(spec.seed, spec.scene), window=deque(maxlen=self.cfg.window_frames),
        )
        self.sessions[spec.session_id] = s
        try:
            if spec.restore is not None:
                self._restore(s, spec.restore)
            elif spec.observation is not None:  # a server's ``first_frame`` (its ground kept) or the client's
                kept = self.starts.take(spec) if self.starts is not None else None
                ready = self.ref.adopt(kept)
                if ready is not None:
                    self.ref.release(s.ref)
                    s.ref = ready  # made with the frame, off the model thread
                    self._observe(s, spec.observation, write=False)
                else:
                    self._observe(s, spec.observation, kept.ground if kept is not None else None)
            elif self.starts is not None:
                self._observe(s, *self.starts.open(spec.scene, spec.seed, spec.bucket))
        except Exception:
            self.free(spec.session_id)
            raise

    def _update(self, upd: SessionUpdate) -> None:
        s = self._get(upd.session_id)
        if upd.bucket is not None and upd.bucket != s.bucket:
            self._switch_bucket(s, upd.bucket)
        if upd.scene is not None and upd.scene != s.scene_text:
            # The cached frames keep the keys/values they were committed with, under the old
            # scene, as in training: the next chunks are conditioned on the new scene and
            # re-colour the view from there. A later re-cache (restore, bucket switch) uses
            # the current scene for every frame.
            s.scene_text, s.scene = upd.scene, self._scene(upd.scene)
            self.ref.rescene(s.ref, upd.scene)
        if upd.observation is not None:
            self._observe(s, upd.observation)

    def _restore(self, s: SessionSlot, st: ModelState) -> None:
        if st.bucket != s.bucket:
            raise ValueError(f"snapshot bucket {st.bucket} does not match session bucket {s.bucket}")
        cfg = self.cfg
        n = st.frames.shape[0]
        if st.frames.shape[1:] != (s.bucket, s.bucket, 3) or st.frames.dtype != np.uint8:
            raise ValueError(f"snapshot frames {st.frames.shape} {st.frames.dtype} do not fit bucket {s.bucket}")
        if st.sink_count > cfg.sink_frames or n - st.sink_count > cfg.window_frames:
            raise ValueError(f"snapshot holds {n} frames ({st.sink_count} sinks), more than the cache")
        s.frame_index = st.frame_index
        s.sinks = [f for f in st.frames[: st.sink_count]]
        s.window.extend(st.frames[st.sink_count :])
        if st.rng.size == s.gen.get_state().numel():
            s.gen.set_state(torch.from_numpy(np.ascontiguousarray(st.rng, dtype=np.uint8)))
        elif st.rng.size:  # a snapshot from a runner on another kind of device: its generator
            # state does not fit this one's, so the noise goes on from a stream of its own
            s.gen.manual_seed(reseed(st))
            log.info("snapshot's noise state is from another device kind: noise reseeded")
        exact = install_cache(self.cfg, self.pools[s.bucket], s, st.family_state, self.device, self.dtype)
        if not exact and n:
            # no cache: rebuilt from the frames, close but not exact (their uint8 rounding, and
            # context that rolled out of the window), from the newest frame
            s.prev = self._encode(st.frames[-1:])[0]
        installed = self.ref.install(s.ref, st.family_state, s.scene_text)
        if installed is not None:
            s.ref = installed
        elif n:  # a state with nothing of this reference's: the newest frame starts it
            self.ref.rebuild(s.ref, st.frames[-1], s.prev)
        if not exact:
            self._recache(s)

    def _scene(self, text: str) -> torch.Tensor:
        vec = np.asarray(self.scene_encoder(text), dtype=np.float32)
        if vec.shape != (self.cfg.scene_dim,):
            raise ValueError(f"scene vector has shape {vec.shape}, model expects ({self.cfg.scene_dim},)")
        return torch.from_numpy(vec).to(self.device, self.dtype)

    def _encode(self, frames: np.ndarray) -> torch.Tensor:
        """uint8 (N, H, W, 3) -> (N, C, H, W) model floats."""
        return WorldModel.encode(torch.from_numpy(np.ascontiguousarray(frames))).to(self.device, self.dtype)

    def _switch_bucket(self, s: SessionSlot, bucket: int) -> None:
        self.cfg.check_bucket(bucket)
        new_slot = self.pools[bucket].allocate()
        self.pools[s.bucket].release(s.slot)
        resize = lambda f: resize_frames(f[None], bucket)[0]  # noqa: E731
        s.sinks = [resize(f) for f in s.sinks]
        s.window = deque((resize(f) for f in s.window), maxlen=self.cfg.window_frames)
        s.bucket, s.slot = bucket, new_slot
        last = [*s.sinks, *s.window]
        s.prev = self._encode(last[-1][None])[0] if last else torch.zeros(
            self.cfg.channels, bucket, bucket, dtype=self.dtype, device=self.device
        )
        self.ref.resized(s.ref, s.prev if last else None)
        self._recache(s)

    def _recache(self, s: SessionSlot) -> None:
        """Rebuild the slot's keys/values from its clean frames in one block-causal pass."""
        frames = [*s.sinks, *s.window]
        pool = self.pools[s.bucket]
        pool.frame_at[s.slot] = -1
        if not frames:
            return
        n = len(frames)
        ids = cached_ids(s)
        x = self._encode(np.stack(frames))[None]  # (1, N, C, H, W)
        # re-cached without references: the frames are already made
        prev = self._without_reference(torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), 1))
        pos = torch.tensor(ids)
        zeros_a = torch.zeros(1, n, self.cfg.action_dim, dtype=self.dtype, device=self.device)
        _, kv = self.model.forward_sequence(
            x, prev, torch.zeros(1, n, device=self.device), zeros_a, s.scene[None], pos,
            torch.zeros(n, dtype=torch.bool), return_kv=True,
        )
        assert kv is not None
        pool.commit([s.slot], np.asarray([ids]), kv[0], kv[1])

    def _observe(self, s: SessionSlot, frame: np.ndarray, ground: np.ndarray | None = None, write: bool = True) -> None:
        """Commit a real frame as the session's next frame (re-anchoring the model), and
        write the place it shows into the reference's memory (or ``ground``, the same view's
        ground alone; ``write`` False: written already)."""
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"observation must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}")
        if write:
            self.ref.write(s.ref, frame, ground)
        if frame.shape[:2] != (s.bucket, s.bucket):
            frame = resize_frames(frame[None], s.bucket)[0]
        fc = self.cfg.frames_per_chunk
        chunk = np.repeat(frame[None], fc, 0)  # a whole chunk of the same observed frame
        x = self._encode(chunk)[None]
        acts = torch.zeros(1, fc, self.cfg.action_dim, dtype=self.dtype, device=self.device)
        self._commit([s], x, acts)

    # --- the hot path ---

    def _run_chunk(self, bucket: int, steps: int, items: list[ChunkWork]) -> np.ndarray:
        """Generate and commit one chunk for each item; returns (B, F, H, W, 3) uint8."""
        with self.ref.busy():
            return self._chunk(bucket, steps, items)

    def _chunk(self, bucket: int, steps: int, items: list[ChunkWork]) -> np.ndarray:
        cfg, model = self.cfg, self.model
        states = [self.sessions[it.session_id] for it in items]
        fc, c = cfg.frames_per_chunk, cfg.channels
        pool = self.pools[bucket]
        if self.graphs is not None and self._graphable(states):
            filling = not bool((pool.frame_at[[st.slot for st in states]] >= 0).all())
            if not (filling and self.graphs.steady_only):
                return self._run_graph(bucket, steps, items, states, filling)
            # traces are of the steady state: record this shape's now, as a CUDA graph's two
            # variants are captured together, so the warm-up (whose caches are still filling
            # at its first step counts) leaves none to record while serving
            self.graphs.get(bucket, steps, len(items)).capture_now()
        ctx = pool.context([s.slot for s in states], np.array([s.frame_index for s in states]))
        actions = torch.from_numpy(np.stack([it.actions for it in items])).to(self.device, self.dtype)
        prev, moved = self._prev_inputs(states, actions)
        scene = torch.stack([s.scene for s in states])
        levels = cfg.noise_levels(steps)
        inp = model.prepare_chunk(prev, actions, scene, [*levels, 0.0])  # shared by every forward
        shape = (fc, c, bucket, bucket)
        pixels, clean, k, v = model.sample_chunk(inp, ctx, lambda i: self._noise(states, shape), self.dtype)
        frames = pixels.cpu().numpy()
        self._advance(states, clean, frames, k, v, moved)
        return frames

    def _prev_inputs(self, states: list[SessionSlot], actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's ``prev`` input (B, F, prev_channels, H, W): the previous frame and the
        reference (``reference/base.py``) for actions clipped to the ranges training saw;
        and what the reference takes after the chunk."""
        b, fc = actions.shape[:2]
        prev = torch.stack([s.prev for s in states])[:, None].expand(b, fc, *states[0].prev.shape)
        ref, moved = self.ref.inputs([s.ref for s in states], prev, clamped_actions(self.cfg, actions))
        return torch.cat((prev, ref.to(prev.dtype)), 2), moved

    def _without_reference(self, prev: torch.Tensor) -> torch.Tensor:
        """Previous frames (B, F, C, H, W) as a ``prev`` input with no anchor reference
        (all-zero reference channels, mask 0)."""
        return F.pad(prev, (0, 0, 0, 0, 0, self.cfg.prev_channels - self.cfg.channels))

    def _graphable(self, states: list[SessionSlot]) -> bool:
        """Whether a chunk has what a captured chunk assumes: one-frame chunks past the sink
        frames (its own queries and keys take no time rotation)."""
        return self.cfg.frames_per_chunk == 1 and all(s.frame_index >= self.cfg.sink_frames for s in states)

    def _run_graph(self, bucket: int, steps: int, items: list[ChunkWork], states: list[SessionSlot],
                   masked: bool) -> np.ndarray:
        """``_run_chunk`` through a ``ChunkGraph``: the same chunk from fixed buffers (the
        masked variant while a session's cache is still filling)."""
        assert self.graphs is not None
        pool = self.pools[bucket]
        slots = [s.slot for s in states]
        graph = self.graphs.get(bucket, steps, len(items), masked)
        b = len(items)
        ctx = pool.context(slots, np.array([s.frame_index for s in states]), out=(graph.ctx_k, graph.ctx_v))
        if graph.mask is not None:
            assert ctx.mask is not None
            graph.mask[:b] = ctx.mask
        actions = torch.from_numpy(np.stack([it.actions for it in items])).to(self.device, self.dtype)
        prev, moved = self._prev_inputs(states, actions)
        graph.prev[:b] = prev[:, 0]
        graph.actions[:b] = actions
        graph.scene[:b] = torch.stack([s.scene for s in states])
        shape = (self.cfg.frames_per_chunk, self.cfg.channels, bucket, bucket)
        for i in range(steps):  # each session's generator draws in the eager path's order
            graph.noise[i, :b] = self._noise(states, shape)
        try:
            pixels, clean, k, v = graph.run()
        except RuntimeError as exc:  # a capture this GPU or torch refuses: stay eager from now on
            # (the eager run draws this chunk's noise again, one step further in each stream)
            log.warning("chunk graphs off, running eagerly: %s", exc)
            self.graphs = None
            return self._run_chunk(bucket, steps, items)
        frames = pixels[:b].cpu().numpy()
        # the graph's outputs are overwritten by its next replay: keep copies
        self._advance(states, clean[:b].clone(), frames, k[:, :b], v[:, :b], moved)
        return frames

    def _commit(self, states: list[SessionSlot], clean: torch.Tensor, actions: torch.Tensor) -> None:
        """Commit given clean chunks (B, F, C, H, W) without generating (observations)."""
        bucket = states[0].bucket
        pool = self.pools[bucket]
        ctx = pool.context([s.slot for s in states], np.array([s.frame_index for s in states]))
        # an observation is committed as it is: no reference
        prev = self._without_reference(torch.stack([s.prev for s in states])[:, None].expand_as(clean))
        scene = torch.stack([s.scene for s in states])
        k, v = self.model.commit_chunk(clean, prev, actions, scene, ctx)
        self._advance(states, clean, self.model.decode(clean).cpu().numpy(), k, v)
        for s in states:  # a real frame is the best reference there is
            self.ref.settle(s.ref, s.prev)

    def _advance(
        self, states: list[SessionSlot], clean: torch.Tensor, frames: np.ndarray,
        k: torch.Tensor, v: torch.Tensor, moved: torch.Tensor | None = None,
    ) -> None:
        fc, s_max = self.cfg.frames_per_chunk, self.cfg.sink_frames
        ids = np.array([[s.frame_index + f for f in range(fc)] for s in states])
        self.pools[states[0].bucket].commit([s.slot for s in states], ids, k, v)
        for i, s in enumerate(states):
            for f in range(fc):
                if s.frame_index < s_max:
                    s.sinks.append(frames[i, f])
                else:
                    s.window.append(frames[i, f])
                s.frame_index += 1
            s.prev = clean[i, -1]
        if moved is not None:
            self.ref.advance([s.ref for s in states], clean[:, -1], moved)

    def _noise(self, states: list[SessionSlot], shape: tuple[int, ...]) -> torch.Tensor:
        """Fresh noise from each session's own generator, so batching never changes it; drawn
        where the model runs (on a GPU, host-drawn noise for a big batch costs more than the
        chunk's replay)."""
        return torch.stack([torch.randn(shape, generator=s.gen, device=self.device) for s in states]).to(self.dtype)

    # --- helpers ---

    def _get(self, session_id: str) -> SessionSlot:
        return session_state(self.sessions, session_id)

    def _runnable(self, out: StepOutput, it: ChunkWork, batch: Batch) -> bool:
        s = self.sessions.get(it.session_id)
        if s is None:
            out.errors[it.session_id] = f"runner has no state for session {it.session_id!r}"
            return False
        if s.bucket != batch.bucket:
            out.errors[it.session_id] = f"session is at bucket {s.bucket}, batch is {batch.bucket}"
            return False
        want = (self.cfg.frames_per_chunk, self.cfg.action_dim)
        if it.actions.shape != want:
            out.errors[it.session_id] = f"actions shape {it.actions.shape}, expected {want}"
            return False
        return True

