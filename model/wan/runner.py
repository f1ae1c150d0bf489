"""The Wan causal family behind the runner contract: executes a ``StepPlan`` (session/plan.py).

One chunk of one session, from noise to pixels::

    noise (C, F, h, w) from the session's generator        F = cfg.chunk_frames latent frames
    for each step t of the (sub-)schedule:
        v  = model.denoise(x_t, t, text, ctx)                the flow, attending to the slot's cache
        x0 = x_t - sigma(t) * v
        x_t = (1 - sigma(t')) x0 + sigma(t') * fresh noise  t' the next step (none after the last)
    model.commit(x0, text, ctx)                             the clean chunk's K/V into the slot
    decoder.decode_batch(streams, x0)                       (F', 8h, 8w, 3) uint8, the VAE's cache

A batch runs every step as one forward over its sessions (same bucket and step count; each row
has its own slot, prompt, noise and frame position), then one commit, then one decode.

Per session the runner keeps (``WanSession``): a slot in the KV cache pool of its bucket, the
prompt's cross-attention K/V (from a cached UMT5 embedding: a prompt costs one encoder pass
per runner), the VAE stream, a noise generator, and the clean latents still needed: the sink
frames, and the latest ``decoder_context`` frames after them (the window's the last of these).
They make the session's ``ModelState``: a restore re-runs the commit pass over the sinks and
the window (``model.recache``) and decodes the kept frames to rebuild the VAE stream's cache
(37 latent frames of reach for Wan2.1's VAE): exact while everything committed is still in the
cache; after the window has rolled, close (as LongLive's re-cache). A prompt change re-caches
the window the same way. A first chunk decodes to ``1 + 4 (F - 1)`` frames (9), every later
one to ``4 F`` (12). The prompt only steers it. A recipe whose ``long_mode`` is "restart" (CausVid)
starts a new rollout from an overlap once a chunk fills one (model/wan/restart.py); Rolling
Forcing's (``sampler`` "rolling") makes each block in a window of blocks in flight
(model/wan/rolling.py) instead of the step loop above. One thread owns a runner: not thread-safe.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.plan_walk import deliver, prepare, session_state
from worldserve.model.wan.backbone import Decoder, load_backbone
from worldserve.model.wan.cache import WanChunkContext, WanKVCache
from worldserve.model.wan.causal import CausalWanModel, TextKV
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.decoding import Decoding
from worldserve.model.wan.layout import check_layout
from worldserve.model.wan.recipes import Recipe, Served
from worldserve.model.wan.restart import restart
from worldserve.model.wan.rolling import InFlight, pack, run_blocks, unpack
from worldserve.model.wan.text import PromptEncoder
from worldserve.model.wan.vae_stream import VaeStream, pixel_frames_for
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

if TYPE_CHECKING:
    from worldserve.model.wan.tae import TaeStream

log = logging.getLogger(__name__)

FAMILY = "wan-causal"
DEFAULT_SIZES = ((480, 832),)  # (height, width) of Wan2.1-T2V-1.3B's training videos
DECODER_CONTEXT = 40  # latent frames kept to rebuild a VAE stream (Wan2.1's decoder sees 37)
VAE_SCALE = 8  # pixels per latent, each side


@dataclass(slots=True)
class WanSession:
    """Physical state of one session."""

    bucket: int
    slot: int
    frame_index: int  # epoch index of the next latent frame
    prompt: str
    text: TextKV  # cross-attention K/V of the prompt, one row
    gen: torch.Generator
    stream: VaeStream | TaeStream
    sinks: list[torch.Tensor] = field(default_factory=list)  # (C, h, w) clean latents, frames 0..S-1
    recent: deque[torch.Tensor] = field(default_factory=deque)  # the latest clean latents after the sinks
    lead: np.ndarray | None = None  # pixel frames the next decoded chunk goes out after (a restart's)
    flight: InFlight | None = None  # Rolling Forcing's blocks in flight (model/wan/rolling.py)


class WanRunner:
    """The ``Runner`` of the Wan causal family; see the module docstring."""

    family = FAMILY
    controls = ("prompt",)

    def __init__(
        self,
        model: CausalWanModel,
        decoder: Decoder,
        text: PromptEncoder | None,
        *,
        sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES,
        max_sessions: int = 8,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        decoder_context: int = DECODER_CONTEXT,
        served: Served | None = None,
        overlap: bool | None = None,
    ):
        """``sizes``: the (height, width) pixel frame sizes served; each is a bucket keyed by
        its height (heights must differ), in multiples of the VAE's 8 times the patch.
        ``served``: the recipe (its prompt switch; printed in /v1/load). ``overlap``: decode a
        batch while the next one generates (``_run_batches``); None: where CUDA runs the model."""
        self.cfg: WanConfig = model.cfg
        self.served = served or Served(None)
        self.device = torch.device(device)
        self.dtype = dtype
        self.model = model.to(self.device, dtype).eval()
        self.decoder = decoder
        self.text = text
        cfg = self.cfg
        if decoder.z_dim != cfg.out_dim:
            raise ValueError(f"the VAE's z_dim {decoder.z_dim} is not the transformer's out_dim {cfg.out_dim}")
        if text is not None and text.dim != cfg.text_dim:
            raise ValueError(f"the text encoder's width {text.dim} is not the transformer's text_dim {cfg.text_dim}")
        heights = [h for h, _ in sizes]
        if not sizes or len(set(heights)) != len(heights):
            raise ValueError(f"sizes {sizes} must be non-empty with distinct heights (a bucket is a height)")
        self.sizes = {h: (h, w) for h, w in sorted(sizes)}
        for h, w in sizes:
            cfg.tokens_per_frame(h // VAE_SCALE, w // VAE_SCALE)  # raises unless a multiple of the patch
            if h % VAE_SCALE or w % VAE_SCALE:
                raise ValueError(f"frame size {h}x{w} is not a multiple of {VAE_SCALE}")
        self.decoder_context = max(decoder_context, cfg.window_frames)
        self.pools = {
            h: WanKVCache.create(cfg, h // VAE_SCALE, w // VAE_SCALE, max_sessions, dtype, self.device)
            for h, w in self.sizes.values()
        }
        # a restart (model/wan/restart.py) decodes in the session's stream while it generates: the
        # CPU's overlapped order, which decodes a batch after the next one generates, would skip ahead
        cpu_in_order = self.device.type != "cuda" and cfg.long_mode == "restart"
        self.overlap: bool = self.device.type == "cuda" if overlap is None else overlap and not cpu_in_order
        self._decode_stream = (torch.cuda.Stream(device=self.device)
                               if self.overlap and self.device.type == "cuda" else None)
        self.sessions: dict[str, WanSession] = {}
        self._told: set[str] = set()  # what was said once (ignored observations)

    @classmethod
    def from_dir(
        cls, path: str | Path, *, threads: int | None = None, dtype: str | torch.dtype = "float32",
        device: str = "cpu", sizes: tuple[tuple[int, int], ...] | None = None, max_sessions: int = 8,
        recipe: Recipe | None = None, vae: str = "full",
    ) -> WanRunner:
        """Load a ``--weights`` directory (model/wan/layout.py), all from local files, serving
        ``recipe`` (model/wan/recipes.py; None: config.json and the house's defaults), decoding
        with ``vae`` (``load_backbone``)."""
        files, cfg, served = check_layout(path, recipe)
        model, decoder, dt = load_backbone(files, cfg, served, threads=threads, dtype=dtype, device=device, vae=vae,
                                           root=path, encode=cfg.long_mode == "restart")
        assert files.text_encoder is not None and files.tokenizer is not None
        text = PromptEncoder.load(files.text_encoder, files.tokenizer, device=device, dtype=dt, text_len=cfg.text_len)
        return cls(model, decoder, text, sizes=sizes or DEFAULT_SIZES, max_sessions=max_sessions, dtype=dt,
                   device=device, served=served)

    # --- the Runner protocol ---

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(self.sizes)

    @property
    def frames_per_chunk(self) -> int:
        return pixel_frames_for(self.cfg.chunk_frames, self.cfg.chunk_frames)

    @property
    def first_chunk_frames(self) -> int:
        return pixel_frames_for(0, self.cfg.chunk_frames)

    @property
    def max_steps(self) -> int:
        return len(self.cfg.timesteps)

    @property
    def capabilities(self) -> Capabilities:
        """Frames per block and size, what it takes, and the recipe served, as /v1/load shows it."""
        cfg = self.cfg
        return Capabilities(self.first_chunk_frames, {b: self._size(b) for b in self.buckets}, self.controls,
                            dtype=str(self.dtype).removeprefix("torch."), recipe=self.served.describe(cfg),
                            schedules=cfg.schedules, steps_cost=cfg.sampler != "rolling", fps=cfg.fps)

    def batch_run_as(self, bucket: int, steps: int, size: int) -> int:
        return size  # batches run as they are; nothing is readied ahead (below)

    def ready_observation(self, scene: str, seed: int, bucket: int, observation: np.ndarray) -> None: ...

    def ready_restore(self, state: ModelState) -> None: ...

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput:
        out = StepOutput()
        prepare(plan, out, self.free, self._open, self._update)
        self._run_batches(out, plan.batches)
        return out

    def _run_batches(self, out: StepOutput, batches: list[Batch]) -> None:
        """Generate and decode each batch; frames go out in the plan's order.

        Serial (``overlap`` off, today's order): generate a batch, decode it, the next. Overlapped:
        a batch's decode is handed on as soon as its latents are committed and the next batch's
        generation starts before it is waited for. On CUDA the decode runs on a second stream
        (``_decode_stream``), so the GPU decodes one batch while it denoises the next; the host
        waits for each batch's frames only after the following batch is enqueued. On the CPU the
        same order runs one thing at a time (the next batch's generation, then the previous
        batch's decode), which is what the tests check. A batch's timing is the wall time from its
        generation's start to the next one's (the last: to its frames on the host), so the
        timings of a plan add up to its wall time either way."""
        pending: list[tuple[Batch, list[ChunkWork], Decoding, float]] = []

        def finish(keep: int) -> None:
            """Wait for all but the latest ``keep`` batches in flight and hand their frames out."""
            while len(pending) > keep:
                batch, items, job, t0 = pending.pop(0)
                try:
                    frames = job.result()
                except Exception as exc:
                    self._fail(out, items, exc)
                    continue
                end = pending[0][3] if pending else time.perf_counter()
                deliver(out, batch.bucket, batch.steps, items, frames, end - t0)

        for batch in batches:
            found = [self._runnable(out, it.session_id, batch) for it in batch.items]
            items = [it for it, s in zip(batch.items, found, strict=True) if s is not None]
            states = [s for s in found if s is not None]
            if not items:
                continue
            t0 = time.perf_counter()
            try:
                x0 = self._generate(batch.steps, states, [it.actions for it in items])
                job = self._submit_decode(states, x0)
            except Exception as exc:  # the batch failed as a whole: each member is told
                self._fail(out, items, exc)
                continue
            pending.append((batch, items, job, t0))
            finish(1 if self.overlap else 0)  # overlapped: the latest batch's decode stays in flight
        finish(0)

    @staticmethod
    def _fail(out: StepOutput, items: list[ChunkWork], exc: Exception) -> None:
        log.error("wan batch of %d failed", len(items), exc_info=exc)
        for it in items:
            out.errors[it.session_id] = f"{type(exc).__name__}: {exc}"

    def export_state(self, session_id: str) -> ModelState:
        s = self._get(session_id)
        h, w = self._size(s.bucket)
        latents = torch.stack([*s.sinks, *s.recent]) if (s.sinks or s.recent) else None
        c, lh, lw = self.cfg.out_dim, h // VAE_SCALE, w // VAE_SCALE
        return ModelState(
            bucket=s.bucket,
            frames=np.zeros((0, h, w, 3), np.uint8),
            sink_count=len(s.sinks),
            frame_index=s.frame_index,
            rng=s.gen.get_state().cpu().numpy().copy(),
            scene=s.prompt,
            latents=latents.float().cpu().numpy() if latents is not None else np.zeros((0, c, lh, lw), np.float32),
            family=self.family, family_state=pack(s.flight),
        )

    def first_frame(self, scene: str, seed: int, bucket: int) -> np.ndarray | None:
        """None: a session starts from noise."""
        self._size(bucket)
        return None

    @torch.inference_mode()
    def warmup(self, batch_sizes: tuple[int, ...]) -> list[BatchTiming]:
        """Run and time every (bucket, trained step count, batch size) on throwaway sessions."""
        return warm_up(self, self.buckets, tuple(sorted(len(ts) for ts in self.cfg.step_lists)), batch_sizes)

    # --- session state ---

    def free(self, session_id: str) -> None:
        s = self.sessions.pop(session_id, None)
        self._told.discard(session_id)
        if s is not None:
            self.pools[s.bucket].release(s.slot)
            s.stream.dispose()

    def _open(self, spec: SessionSpec) -> None:
        if spec.session_id in self.sessions:
            self.free(spec.session_id)  # a new epoch replaces the old state
        self._size(spec.bucket)
        if spec.observation is not None:
            self._ignore_observation(spec.session_id)
        slot = self.pools[spec.bucket].allocate()
        s = WanSession(
            bucket=spec.bucket, slot=slot, frame_index=0, prompt=spec.scene, text=self._text_kv(spec.scene),
            gen=torch.Generator(self.device).manual_seed(spec.seed), stream=self.decoder.open(),
            recent=deque(maxlen=self.decoder_context),
        )
        self.sessions[spec.session_id] = s
        try:
            if spec.restore is not None:
                self._restore(s, spec.restore)
        except Exception:
            self.free(spec.session_id)
            raise

    def _update(self, upd: SessionUpdate) -> None:
        s = self._get(upd.session_id)
        if upd.observation is not None:
            self._ignore_observation(upd.session_id)
        if upd.scene is not None and upd.scene != s.prompt:
            s.prompt, s.text = upd.scene, self._text_kv(upd.scene)
            self._switch_prompt(s)
        if upd.bucket is not None and upd.bucket != s.bucket:
            self._switch_bucket(s, upd.bucket)

    def _switch_prompt(self, s: WanSession) -> None:
        """The cache under a new prompt. The longlive recipe does as LongLive's interactive
        pipeline (``_recache_after_switch`` with ``global_sink``): the latest sinks + window +
        chunk frames (their ``local_attn_size``) are recomputed in one pass, every one seeing
        all of them; past those first frames the sinks keep the old prompt's keys and values
        and only the frames after them are recomputed (the oldest chunk of them is read by
        the others in that pass, then dropped). Other recipes re-commit the sinks and the
        window chunk by chunk under the new prompt (``_recache``)."""
        r, cfg = self.served.recipe, self.cfg
        if r is None or r.prompt_switch != "longlive" or s.frame_index == 0:
            self._recache(s)
            return
        n = s.frame_index
        keep_sinks = n > cfg.sink_frames + cfg.window_frames + cfg.chunk_frames
        count = cfg.window_frames + cfg.chunk_frames if keep_sinks else n
        frames = [*s.sinks, *s.recent][-count:]
        self.model.recache_jointly(self.pools[s.bucket], s.slot, torch.stack(frames, 1), range(n - count, n), s.text,
                                   keep_sinks)

    def _restore(self, s: WanSession, st: ModelState) -> None:
        cfg = self.cfg
        if st.family != self.family or st.latents is None:
            raise ValueError(f"snapshot is of model family {st.family!r}, this runner serves {self.family!r}")
        if st.bucket != s.bucket:
            raise ValueError(f"snapshot bucket {st.bucket} does not match session bucket {s.bucket}")
        h, w = self._size(s.bucket)
        want = (cfg.out_dim, h // VAE_SCALE, w // VAE_SCALE)
        lat = st.latents
        if lat.ndim != 4 or lat.shape[1:] != want or lat.dtype != np.float32:
            shape = ", ".join(map(str, want))
            raise ValueError(f"snapshot latents {lat.shape} {lat.dtype}, expected (N, {shape}) float32")
        n, sinks = lat.shape[0], st.sink_count
        want_sinks = min(cfg.sink_frames, st.frame_index)
        if sinks != want_sinks or n - sinks > st.frame_index - sinks or n - sinks < min(
            cfg.window_frames, st.frame_index - sinks
        ):
            raise ValueError(
                f"snapshot holds {n} latent frames ({sinks} sinks) at frame {st.frame_index}; expected "
                f"{want_sinks} sinks and at least the window's {min(cfg.window_frames, st.frame_index - sinks)} frames"
            )
        x = torch.from_numpy(np.ascontiguousarray(lat)).to(self.device)  # float32, as generation keeps them
        s.frame_index = st.frame_index
        s.sinks = list(x[:sinks])
        s.recent.extend(x[sinks:])  # the latest ``decoder_context`` of them
        if st.rng.size == s.gen.get_state().numel():
            s.gen.set_state(torch.from_numpy(np.ascontiguousarray(st.rng, dtype=np.uint8)))
        else:  # a snapshot from another kind of device: its noise goes on from a stream of its own
            digest = hashlib.blake2b(np.ascontiguousarray(st.rng).tobytes(), digest_size=8,
                                     person=st.frame_index.to_bytes(8, "little"))
            s.gen.manual_seed(int.from_bytes(digest.digest(), "little") >> 1)
            log.info("snapshot's noise state is from another device kind: noise reseeded")
        if self.cfg.sampler == "rolling" and st.frame_index:
            f, blocks = self.cfg.chunk_frames, len(self.cfg.timesteps) - 1
            s.flight = unpack(st.family_state, cfg.out_dim, blocks, f, *want[1:], self.device)
        self._rebuild(s)
        self._prime_stream(s)

    def _rebuild(self, s: WanSession) -> None:
        """The slot's cache after a restore: the window re-cached (``_recache``). A family
        that can replay more of the kept latents does (Matrix-Game)."""
        self._recache(s)

    def _switch_bucket(self, s: WanSession, bucket: int) -> None:
        """Move to another frame size: the latents resized, the cache and the VAE stream rebuilt."""
        h, w = self._size(bucket)
        slot = self.pools[bucket].allocate()
        self.pools[s.bucket].release(s.slot)
        size = (h // VAE_SCALE, w // VAE_SCALE)
        def resize(x: torch.Tensor) -> torch.Tensor:
            return F.interpolate(x[None].float(), size=size, mode="bilinear", align_corners=False)[0].to(x.dtype)

        s.sinks = [resize(x) for x in s.sinks]
        s.recent = deque((resize(x) for x in s.recent), maxlen=self.decoder_context)
        if s.flight is not None:
            s.flight = InFlight(torch.stack([resize(x) for x in s.flight.latents.unbind(1)], 1))
        s.bucket, s.slot = bucket, slot
        s.stream.dispose()
        s.stream = self.decoder.open()
        self._recache(s)
        self._prime_stream(s)

    def _held(self, s: WanSession) -> tuple[torch.Tensor, list[int]] | None:
        """The clean latents the cache holds (C, N, h, w) and their epoch frame ids: the sinks,
        then the latest ``window_frames`` frames after them."""
        window = list(s.recent)[-self.cfg.window_frames:] if s.recent else []
        frames = [*s.sinks, *window]
        if not frames:
            return None
        ids = [*range(len(s.sinks)), *range(s.frame_index - len(window), s.frame_index)]
        return torch.stack(frames, 1), ids

    def _recache(self, s: WanSession) -> None:
        """Rebuild the slot's keys/values from the held latents, under the session's prompt."""
        held = self._held(s)
        if held is None:
            self.pools[s.bucket].reset(s.slot)
            return
        self.model.recache(self.pools[s.bucket], s.slot, held[0], held[1], s.text)

    def _prime_stream(self, s: WanSession) -> None:
        """A fresh VAE stream fed the kept latents (their pixels thrown away), so that the next
        chunk decodes as it would have after the whole history: exactly when the kept frames
        are the whole history or cover the decoder's receptive field."""
        whole = s.frame_index == len(s.sinks) + len(s.recent)
        frames = [*s.sinks, *s.recent] if whole else list(s.recent)
        s.stream.dispose()
        s.stream = self.decoder.open()
        if frames:
            with self._decoding():
                x = torch.stack(frames, 1)[None]  # (1, C, N, h, w)
                for i in range(0, x.shape[2], self.cfg.chunk_frames):
                    self.decoder.decode_batch_float([s.stream], x[:, :, i:i + self.cfg.chunk_frames])

    def _text_kv(self, prompt: str) -> TextKV:
        emb = self.text.encode(prompt)  # (text_len, text_dim), cached by the encoder
        return self.model.text_kv(emb[None].to(self.device, self.dtype))

    def _ignore_observation(self, session_id: str) -> None:
        if session_id not in self._told:
            self._told.add(session_id)
            log.info("session %s: wan-causal takes no observations; ignored", session_id)

    # --- the hot path ---

    def _run_chunk(self, steps: int, states: list[WanSession], actions: list[np.ndarray] | None = None
                   ) -> list[np.ndarray]:
        """Generate, commit and decode one chunk for each session; (F', H, W, 3) uint8 each."""
        return self._submit_decode(states, self._generate(steps, states, actions)).result()

    def _generate(self, steps: int, states: list[WanSession], actions: list[np.ndarray] | None = None
                  ) -> torch.Tensor:
        """Generate and commit one chunk for each session: the clean latents (B, C, F, h, w).
        ``actions``: each session's (frames, ACTION_DIM) actions of the block."""
        cfg = self.cfg
        pool = self.pools[states[0].bucket]
        if cfg.sampler == "rolling":  # its steps are its window's levels, one list (no step rung)
            x0 = run_blocks(self.model, pool, states)
        else:
            ctx = pool.chunk([s.slot for s in states], np.array([s.frame_index for s in states]), cfg.chunk_frames)
            extra = self._chunk_inputs(states, ctx, actions)
            text = TextKV.cat([s.text for s in states]) if len(states) > 1 else states[0].text
            shape = (cfg.out_dim, cfg.chunk_frames, pool.height, pool.width)
            ts = self.schedule(steps)
            x = self._noise(states, shape)  # (B, C, F, h, w)
            x0 = x
            for i, t in enumerate(ts):
                tt = torch.full((len(states),), t, device=self.device, dtype=torch.float32)
                v = self.model.denoise(x, tt, text, ctx, **extra)
                x0 = x - cfg.sigma(t) * v
                if i + 1 < len(ts):
                    sigma = cfg.sigma(ts[i + 1])
                    x = (1 - sigma) * x0 + sigma * self._noise(states, shape)
            self.model.commit(x0, text, ctx, **extra)
        for b, s in enumerate(states):
            for f in range(cfg.chunk_frames):
                frame = x0[b, :, f].clone()
                if s.frame_index < cfg.sink_frames:
                    s.sinks.append(frame)
                else:
                    s.recent.append(frame)
                s.frame_index += 1
        if cfg.long_mode == "restart":
            for b, s in enumerate(states):
                if s.frame_index == cfg.rollout_frames:
                    x0[b] = self._restart(s, x0[b])
        return x0

    def _restart(self, s: WanSession, chunk: torch.Tensor) -> torch.Tensor:
        """CausVid's next rollout from the overlap of the chunk that ended one (model/wan/restart.py);
        returns the overlap, which the session's new stream decodes after ``s.lead``."""
        with self._decoding():
            overlap, lead, s.stream = restart(self.model, self.decoder, self.pools[s.bucket], s.slot, s.stream,
                                              s.text, chunk)
        s.lead = lead.cpu().numpy()
        s.frame_index = overlap.shape[1]
        s.recent.clear()
        s.recent.extend(overlap.unbind(1))
        return overlap

    def _submit_decode(self, states: list[WanSession], x0: torch.Tensor) -> Decoding:
        """Start decoding a chunk's latents in the sessions' streams: on the decode stream where
        there is one (its pixels copied to pinned host memory there); on the CPU at once, or,
        overlapped, when its result is asked for."""
        streams = [s.stream for s in states]
        leads = [s.lead for s in states]
        for s in states:
            s.lead = None
        side = self._decode_stream
        if side is None:
            if self.overlap:  # the CPU: decoded when waited for, after the next batch's generation
                return Decoding(later=lambda: self.decoder.decode_batch(streams, x0), leads=leads)
            return Decoding(self.decoder.decode_batch(streams, x0), leads=leads)
        side.wait_stream(torch.cuda.current_stream(self.device))  # the latents, committed
        with torch.cuda.stream(side):
            x0.record_stream(side)  # made on the main stream: not reused before the decode has read it
            pixels = self.decoder.decode_batch(streams, x0)
            host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in pixels]
            for h, p in zip(host, pixels, strict=True):
                h.copy_(p, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        return Decoding(host, done, leads=leads)

    @contextmanager
    def _decoding(self) -> Iterator[None]:
        """Decoder work outside the hot path (priming a stream) on the decode stream too, so that
        every stream cache lives on one CUDA stream."""
        side = self._decode_stream
        if side is None:
            yield
            return
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            yield
        side.synchronize()

    def _chunk_inputs(self, states: list[WanSession], ctx: WanChunkContext, actions: list[np.ndarray] | None
                      ) -> dict[str, object]:
        """Inputs of the chunk's passes besides latents and prompt (a subclass's: Matrix-Game's
        image condition and actions); none here."""
        return {}

    def schedule(self, steps: int) -> tuple[float, ...]:
        """The model timesteps of the trained step list of ``steps`` steps (a few-step student is
        trained for its own lists only; no subset of one is served); ValueError for another count."""
        for ts in self.cfg.schedules:
            if len(ts) == steps:
                return ts
        counts = ", ".join(str(len(ts)) for ts in self.cfg.schedules)
        raise ValueError(f"steps {steps}: the recipe is trained for {counts} steps only")

    def _noise(self, states: list[WanSession], shape: tuple[int, ...]) -> torch.Tensor:
        """Fresh noise from each session's own generator, so batching never changes it."""
        return torch.stack([torch.randn(shape, generator=s.gen, device=self.device) for s in states])  # float32

    # --- helpers ---

    def _size(self, bucket: int) -> tuple[int, int]:
        try:
            return self.sizes[bucket]
        except KeyError:
            raise ValueError(f"bucket {bucket} is not served; buckets: {list(self.sizes)}") from None

    def _get(self, session_id: str) -> WanSession:
        return session_state(self.sessions, session_id)

    def _runnable(self, out: StepOutput, sid: str, batch: Batch) -> WanSession | None:
        s = self.sessions.get(sid)
        if s is None:
            out.errors[sid] = f"runner has no state for session {sid!r}"
            return None
        if s.bucket != batch.bucket:
            out.errors[sid] = f"session is at bucket {s.bucket}, batch is {batch.bucket}"
            return None
        return s
