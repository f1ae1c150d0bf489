"""Matrix-Game 2.0 behind the runner contract: the Wan causal runner (``model/wan/runner.py``)
with an anchor image instead of a prompt, and the player's keys and mouse.

One chunk of one session, beyond what ``WanRunner`` does::

    block actions (frames, 6)      the server's held keys and mouse delta per pixel frame
      -> map_actions               the variant's keyboard / mouse vectors (model/wan/action.py)
      -> ActionHistory.windows     each latent frame's window of 12 pixel-frame actions
      -> ActionKVCache.chunk       the action modules' context, beside the KV cache's
    anchor.cond[:, m .. m+F-1]     the image condition of the chunk's model frames m..
    model.denoise / commit(..., cond=, act=)

The anchor is the image the session is conditioned on: the client's ``observation``, or the
model's own start frame (``DIR/start.png`` where it exists, else the procedural world's view;
``first_frame``). Its condition is what the authors feed: the VAE latent of the image followed
by blank frames, with a mask that is 1 on the image's latent frame (``cond``, 20 channels
beside the 16 of the latents), and its CLIP tokens through ``img_emb`` as the cross-attention's
keys and values (kept per session like a prompt's). The authors encode the whole
[image, blank...] video of their rollout in one go. The Wan2.1 VAE's encoder is causal with a
finite reach back in time: its latent frame n depends on pixel frames back to latent frame
n - 28, so with blank frames after the image every latent frame from 29 on is the same tensor
(the blank video's, whatever the image). ``COND_FRAMES`` (30) are encoded, and later model
frames reuse the last: equal, frame for frame, to the authors' full-length encode however long
the stream runs.

An ``observation`` mid-stream re-anchors the session: the new image's condition and CLIP
tokens replace the old, the window is emptied (the next chunk starts at model frame 0, whose
first latent frame is the image's), the action history starts again, and the VAE stream goes
on so the picture stays continuous.

A migration carries the anchor image (``ModelState.frames``), the kept latents (the latest
``decoder_context``), the noise state, and in its family state the pixel-frame actions the kept
frames were made with and the anchor's epoch frame. The target replays the kept latents from
the anchor on, chunk by chunk as they were made, through commit passes under those actions
(``_replay``), so the caches (self-attention, keyboard, mouse) hold what the source's held,
and the VAE stream is primed from the same latents. A cache entry depends on the chunks
before it through every cached attention of the forward, one chunk each (the self-attentions
and the mouse attentions; the keyboard's keys come from the keys alone), so the replay is bit
for bit when it starts at the anchor or spans that depth in chunks. At the real size (30 + 15
levels) the 40 kept frames replay 13 chunks: past the anchor the caches start from a chunk
that saw nothing before it and each replayed chunk recomputes one level more, so the next
frames are close, not exact (docs/model-families.md: how close on the tiny model). A snapshot without
a trace (an older worker's) is re-cached with nothing held, counting from frame 0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from worldserve.model.wan.action import (
    ActionHistory,
    ActionKVCache,
    map_actions,
    pixel_frames_of,
    variant_of,
)
from worldserve.model.wan.backbone import load_backbone
from worldserve.model.wan.cache import WanChunkContext
from worldserve.model.wan.causal import CausalWanModel
from worldserve.model.wan.clip import ImageEncoder
from worldserve.model.wan.config import COND_MASK_CHANNELS
from worldserve.model.wan.layout import check_image_layout
from worldserve.model.wan.recipes import Recipe, Served
from worldserve.model.wan.runner import DECODER_CONTEXT, WanRunner, WanSession
from worldserve.model.wan.vae_stream import StreamingDecoder
from worldserve.session.family_state import entry, pack_scalar, scalar
from worldserve.session.msgfields import MAX_INT
from worldserve.session.plan import ModelState, SessionSpec, SessionUpdate

log = logging.getLogger(__name__)

FAMILY = "matrix-game-2"
DEFAULT_SIZES = ((352, 640),)  # the authors' frames: 44 x 80 latents, 880 tokens a frame
# latent frames of the anchor's condition encoded (117 pixel frames): the image reaches latent frames
# 0-28 through the VAE encoder's causal convolutions; from 29 on, the latent of blank frames is constant
COND_FRAMES = 30


@dataclass(slots=True)
class Anchor:
    """The image a session is conditioned on."""

    image: np.ndarray  # (H, W, 3) uint8 at the session's frame size
    cond: torch.Tensor  # (cond_dim, COND_FRAMES, h, w): mask then the latent of [image, blank, ...]
    frame: int  # the epoch latent frame that is the model's frame 0


@dataclass(slots=True)
class MatrixGameSession(WanSession):
    anchor: Anchor | None = None
    history: ActionHistory | None = None


class MatrixGameRunner(WanRunner):
    """The ``Runner`` of Matrix-Game 2.0; see the module docstring."""

    family = FAMILY
    controls = ("keys", "mouse", "observation")

    def __init__(self, model: CausalWanModel, decoder: StreamingDecoder, clip: ImageEncoder, *,
                 sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES, max_sessions: int = 8,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 start_image: np.ndarray | None = None, decoder_context: int = DECODER_CONTEXT,
                 served: Served | None = None, overlap: bool | None = None):
        a = model.cfg.action_config
        if a is None or model.cfg.model_type != "i2v":
            raise ValueError("MatrixGameRunner serves an i2v model with action modules (action_config)")
        if clip.dim != model.cfg.image_dim:
            raise ValueError(
                f"the CLIP encoder's width {clip.dim} is not the transformer's image_dim {model.cfg.image_dim}")
        super().__init__(model, decoder, None, sizes=sizes, max_sessions=max_sessions, dtype=dtype, device=device,
                         decoder_context=decoder_context, served=served, overlap=overlap)
        self.clip = clip
        self.variant = variant_of(a)
        self.start_image = start_image
        self.actions = {h: ActionKVCache.create(self.cfg, pool) for h, pool in self.pools.items()}
        # pixel-frame actions kept: the windows of every kept latent frame (a restore replays them)
        r = a.vae_time_compression_ratio
        self.keep_actions = a.window_pixel_frames + r * (self.decoder_context + self.cfg.chunk_frames) + r

    @classmethod
    def from_dir(  # type: ignore[override]
        cls, path: str | Path, *, threads: int | None = None, dtype: str | torch.dtype = "float32",
        device: str = "cpu", sizes: tuple[tuple[int, int], ...] | None = None, max_sessions: int = 8,
        recipe: Recipe | None = None, vae: str = "full",
    ) -> MatrixGameRunner:
        """Load a ``--weights`` directory (model/wan/layout.py, ``check_image_layout``), serving
        ``recipe`` (None: the variant its config.json names), decoding with ``vae`` (the image
        condition is encoded by the full VAE either way)."""
        files, cfg, served = check_image_layout(path, recipe)
        model, decoder, dt = load_backbone(files, cfg, served, threads=threads, dtype=dtype, device=device, vae=vae,
                                           root=path, encode=True)
        assert files.image_encoder is not None
        clip = ImageEncoder.load(files.image_encoder, device=device, dtype=dt)
        start = None
        if files.start_image is not None:
            from PIL import Image

            start = np.asarray(Image.open(files.start_image).convert("RGB"))
        return cls(model, decoder, clip, sizes=sizes or DEFAULT_SIZES, max_sessions=max_sessions, dtype=dt,
                   device=device, start_image=start, served=served)

    # --- the contract ---

    def first_frame(self, scene: str, seed: int, bucket: int) -> np.ndarray | None:
        """The model's own start frame at the bucket's size: ``DIR/start.png``, else the world's
        view of ``scene`` from a place drawn from ``seed``. Safe off the model thread."""
        h, w = self._size(bucket)
        if self.start_image is not None:
            return fit_frame(self.start_image, h, w)
        from worldserve.world.start import start_frame

        return fit_frame(start_frame(scene, seed, 64), h, w)

    def export_state(self, session_id: str) -> ModelState:
        st = super().export_state(session_id)
        s = self._mg(session_id)
        assert s.anchor is not None and s.history is not None
        st.frames = s.anchor.image[None].copy()  # (1, H, W, 3): the anchor image
        h = s.history
        st.family_state.update(action_keyboard=h.keyboard.copy(), action_mouse=h.mouse.copy(),
                               action_first=pack_scalar(h.first), action_anchor_frame=pack_scalar(s.anchor.frame))
        return st

    # --- session state ---

    def _open(self, spec: SessionSpec) -> None:
        if spec.session_id in self.sessions:
            self.free(spec.session_id)
        h, w = self._size(spec.bucket)
        image = spec.observation
        if spec.restore is not None and spec.restore.frames.shape[0] == 1:
            image = spec.restore.frames[0]
        if image is None:
            image = self.first_frame(spec.scene, spec.seed, spec.bucket)
        assert image is not None
        image = fit_frame(image, h, w)
        slot = self.pools[spec.bucket].allocate()
        anchor = self._anchor(image, 0)
        s = MatrixGameSession(
            bucket=spec.bucket, slot=slot, frame_index=0, prompt=spec.scene, text=self._image_kv(image),
            gen=torch.Generator(self.device).manual_seed(spec.seed), stream=self.decoder.open(),
            anchor=anchor, history=ActionHistory.empty(self._action_cfg),
        )
        s.recent = type(s.recent)(maxlen=self.decoder_context)
        self.sessions[spec.session_id] = s
        try:
            if spec.restore is not None:
                self._restore(s, spec.restore)
        except Exception:
            self.free(spec.session_id)
            raise

    def _update(self, upd: SessionUpdate) -> None:
        s = self._mg(upd.session_id)
        if upd.bucket is not None and upd.bucket != s.bucket:
            self._switch_bucket(s, upd.bucket)
        if upd.observation is not None:
            self._reanchor(s, upd.observation)
        # a scene prompt has no effect: Matrix-Game takes no text

    def _reanchor(self, s: MatrixGameSession, image: np.ndarray) -> None:
        """Condition the session on a new image from its next frame on (see the module docstring)."""
        h, w = self._size(s.bucket)
        image = fit_frame(image, h, w)
        s.anchor = self._anchor(image, s.frame_index)
        s.text = self._image_kv(image)
        s.history = ActionHistory.empty(self._action_cfg)
        s.sinks.clear()  # the latents stay in ``recent``: the VAE stream goes on through them
        pool = self.pools[s.bucket]
        pool.reset(s.slot)
        pool.seek(s.slot, s.frame_index)

    def _switch_bucket(self, s: WanSession, bucket: int) -> None:
        assert isinstance(s, MatrixGameSession) and s.anchor is not None
        h, w = self._size(bucket)
        s.anchor = self._anchor(fit_frame(s.anchor.image, h, w), s.anchor.frame)
        super()._switch_bucket(s, bucket)

    def _restore(self, s: WanSession, st: ModelState) -> None:
        assert isinstance(s, MatrixGameSession) and s.history is not None and s.anchor is not None
        a = self._action_cfg
        r = a.vae_time_compression_ratio
        if "action_keyboard" not in st.family_state:  # a state without its actions: re-cached with nothing held
            n = pixel_frames_of(st.frame_index, self.cfg.chunk_frames, r)[0]
            s.history.extend(np.zeros((n, a.keyboard_dim_in), np.float32),
                             np.zeros((n, s.history.mouse.shape[1]), np.float32), self.keep_actions)
        else:
            keyboard, mouse, first, anchor_frame = self._action_trace(st)
            end = pixel_frames_of(st.frame_index - anchor_frame, 0, r)[0]  # pixel frames made since the anchor
            if first + len(keyboard) != end:
                raise ValueError(f"snapshot's actions cover pixel frames {first}..{first + len(keyboard) - 1}; "
                                 f"{st.frame_index - anchor_frame} latent frames since the anchor made {end}")
            s.history = ActionHistory(a, keyboard, mouse, first)
            s.anchor.frame = anchor_frame
        super()._restore(s, st)

    def _action_trace(self, st: ModelState) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The actions a state's window was made with, checked against this variant: keyboard
        (N, K) and mouse (N, M) float32, one row a pixel frame from ``first`` on, counted from
        the anchor, and the latent frame that is the anchor's frame 0."""
        fs, a, family = st.family_state, self._action_cfg, "matrix_game"
        keyboard = entry(fs, "action_keyboard", "float32", (None, a.keyboard_dim_in), family=family)
        assert keyboard is not None
        mouse = entry(fs, "action_mouse", "float32", (len(keyboard), self._mouse_width()), family=family)
        assert mouse is not None
        first = scalar(fs, "action_first", 0, MAX_INT, family=family)
        anchor_frame = scalar(fs, "action_anchor_frame", 0, st.frame_index, family=family)
        return keyboard, mouse, first, anchor_frame

    def _mouse_width(self) -> int:
        return ActionHistory.empty(self._action_cfg).mouse.shape[1]

    def _rebuild(self, s: WanSession) -> None:
        self._replay(s, len(s.recent))

    def _recache(self, s: WanSession) -> None:
        self._replay(s, self.cfg.window_frames)

    def _replay(self, s: WanSession, frames_back: int) -> None:
        """Rebuild the slot from the latest ``frames_back`` kept latents as the session made
        them: from the anchor on (and from the oldest whose action windows the history holds),
        committed chunk by chunk as they were generated, under the actions they were made
        with (see the module docstring). The window is always among them."""
        assert isinstance(s, MatrixGameSession) and s.anchor is not None and s.history is not None
        a, cfg = self._action_cfg, self.cfg
        r, w = a.vae_time_compression_ratio, a.window_pixel_frames
        kept = list(s.recent)
        covered = s.anchor.frame + (0 if s.history.first == 0 else -(-(s.history.first + w) // r))
        start = max(s.frame_index - min(len(kept), frames_back), s.anchor.frame, covered)
        start += -(start - s.anchor.frame) % cfg.chunk_frames  # from a chunk's first frame
        start = min(start, s.frame_index - min(cfg.window_frames, s.frame_index - s.anchor.frame))
        ids = list(range(start, s.frame_index))
        frames = kept[len(kept) - len(ids):] if ids else []
        if s.sinks and s.anchor.frame == 0:
            ids, frames = [*range(len(s.sinks)), *ids], [*s.sinks, *frames]
        pool = self.pools[s.bucket]
        if not ids:
            pool.reset(s.slot)
            pool.seek(s.slot, s.frame_index)
            return
        self.model.recache(pool, s.slot, torch.stack(frames, 1), ids, s.text,
                           lambda ctx: self._chunk_inputs([s], ctx, None))

    # --- the hot path ---

    def _chunk_inputs(self, states: list[WanSession], ctx: WanChunkContext, actions: list[np.ndarray] | None
                      ) -> dict[str, object]:
        """The chunk's image condition and action context. ``actions`` (the blocks' per-frame
        actions) extend each session's history; None (a re-cache) reads what it holds."""
        a = self._action_cfg
        f = ctx.num_frames
        conds, kbs, mss = [], [], []
        for b, s in enumerate(states):
            assert isinstance(s, MatrixGameSession) and s.anchor is not None and s.history is not None
            m = int(ctx.start_frames[b]) - s.anchor.frame  # the chunk's first model frame
            if actions is not None:
                first, count = pixel_frames_of(m, f, a.vae_time_compression_ratio)
                if s.history.end != first:
                    raise ValueError(f"action history ends at pixel frame {s.history.end}, the chunk starts at {first}")
                rows = fit_rows(actions[b], count)
                kb, ms = map_actions(a, rows)
                s.history.extend(kb, ms, self.keep_actions)
            kb_w, ms_w = s.history.windows(m, f)
            kbs.append(torch.from_numpy(kb_w))
            mss.append(torch.from_numpy(ms_w))
            conds.append(condition_frames(s.anchor.cond, m, f))
        act = self.actions[states[0].bucket].chunk(
            ctx, torch.stack(kbs).to(self.device, self.dtype),
            torch.stack(mss).to(self.device, self.dtype) if a.enable_mouse else None,
        )
        return {"cond": torch.stack(conds), "act": act}

    # --- helpers ---

    @property
    def _action_cfg(self):
        a = self.cfg.action_config
        assert a is not None
        return a

    def _mg(self, session_id: str) -> MatrixGameSession:
        s = self._get(session_id)
        assert isinstance(s, MatrixGameSession)
        return s

    def _image_kv(self, image: np.ndarray):
        return self.model.image_kv(self.clip.encode(image).to(self.device, self.dtype))

    def _anchor(self, image: np.ndarray, frame: int) -> Anchor:
        return Anchor(image=image, cond=image_condition(self.decoder, image).to(self.device, self.dtype), frame=frame)


@torch.inference_mode()
def image_condition(decoder: StreamingDecoder, image: np.ndarray) -> torch.Tensor:
    """The condition of ``image`` (H, W, 3) uint8, (cond_dim, COND_FRAMES, H/8, W/8) float32 on
    the decoder's device: the authors' VAE latent of [image, blank frames] beside a mask that is
    1 on the image's latent frame."""
    h, w = image.shape[:2]
    video = torch.zeros(3, 1 + 4 * (COND_FRAMES - 1), h, w, device=decoder.device)
    video[:, 0] = torch.from_numpy(np.ascontiguousarray(image)).to(video.device).permute(2, 0, 1).float() / 127.5 - 1
    latent = decoder.encode_video(video)  # (C, COND_FRAMES, h/8, w/8)
    mask = torch.zeros(COND_MASK_CHANNELS, *latent.shape[1:], device=latent.device)
    mask[:, 0] = 1
    return torch.cat((mask, latent), 0)


def condition_frames(cond: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """Model frames ``first`` .. ``first + count - 1`` of an anchor's condition (cond_dim, N, h, w):
    past the encoded ones, the last (the blank video's constant latent)."""
    idx = torch.clamp(torch.arange(first, first + count), max=cond.shape[1] - 1)
    return cond[:, idx.to(cond.device)]


def fit_rows(actions: np.ndarray, count: int) -> np.ndarray:
    """A block's per-frame actions for ``count`` pixel frames: its latest ``count`` rows, the
    last one repeated where it holds fewer."""
    actions = np.asarray(actions, np.float32)
    if len(actions) >= count:
        return actions[len(actions) - count:]
    last = actions[-1:] if len(actions) else np.zeros((1, actions.shape[1]), np.float32)
    pad = np.repeat(last, count - len(actions), 0)
    return np.concatenate((actions, pad))


def fit_frame(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """An image (H, W, 3) uint8 at ``height`` x ``width``: centre-cropped to the aspect, then
    resized (antialiased bilinear), as the authors prepare their start images."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"an anchor image is (H, W, 3) uint8, got {image.dtype} {image.shape}")
    ih, iw = image.shape[:2]
    if (ih, iw) == (height, width):
        return image
    if ih * width > iw * height:  # too tall: crop rows
        ch, cw = max(1, round(iw * height / width)), iw
    else:
        ch, cw = ih, max(1, round(ih * width / height))
    top, left = (ih - ch) // 2, (iw - cw) // 2
    x = torch.from_numpy(np.ascontiguousarray(image[top:top + ch, left:left + cw])).permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()

