"""The Wan2.1 causal family's serving speed: random weights at the real sizes, one session and
N sessions batched across clients.

    python -m bench.gpu_wan [--sessions 1 2 4] [--chunks 8] [--dtype bfloat16|float32]
                            [--height 480 --width 832] [--no-overlap] [--tiny]
                            [--model wan-causal|matrix-game-2] [--recipe NAME] [--vae full|tae]

Builds the Wan2.1-T2V-1.3B causal transformer (``model/wan/causal.py``), the Wan2.1 VAE
(``model/wan/vae_stream.py``) and UMT5-XXL's encoder with random weights on the device, then for
each session count N runs N sessions as one batch, chunk after chunk: 4 denoising steps and the
commit pass (``model/wan/sampler.generate_chunk``), then the streaming VAE decode of the chunk.
The cache fills for ``cache_frames / chunk_frames`` chunks; the numbers are taken after it is
full (steady state: constant work a chunk forever).

Per row: ms a chunk to generate (steps + commit) and to decode, ms a chunk end to end serially
and with the decode on a second CUDA stream overlapping the next chunk's generation, pixel
frames a second per session and in all, and the memory each session holds. The summary::

    gpu_wan fps_1=<x> ttff_s=<x> sessions_at_16fps=<n> batching_gain=<x> decode_share=<x>

fps_1: one session's pixel frames a second (the better of serial and overlapped); ttff_s: a new
session's first frames, prompt pass (a text-cache miss) + first chunk + its decode, in a warm
process; sessions_at_16fps: the most sessions measured that each get >= 16 fps; batching_gain:
frames a second in all at the largest N measured over fps_1; decode_share: decode's share of a
serial chunk at N = 1.

``--model matrix-game-2``: Matrix-Game 2.0 (1.62B with its action modules, 352x640, 3 steps,
a window of 3 latent frames and no sinks, keyboard and mouse caches beside the KV cache, CLIP
ViT-H/14 instead of UMT5); every chunk gets fresh keyboard and mouse windows from the host
and the image condition, as served (model/wan/matrix_game.py). ttff_s is then the anchor image's
CLIP pass, its VAE condition, the first chunk and its decode. Its rows add a key-to-frame
latency estimate: a key pressed at a uniformly random time waits for the next chunk to start
(half a chunk period on average, the period being the chunk's time end to end as measured),
then that chunk's generation and decode (its first frames carry the key: a latent frame's
action window includes its own pixel frames but the last); transport and encoding are not
counted, nor lookahead (each chunk of lookahead adds a period). Its summary line adds
``key_ms_p50=<x>`` at N = 1.

``--recipe NAME`` (model/wan/recipes.py) times a published checkpoint's settings: its steps,
chunk, sinks and window (a Matrix-Game recipe picks its variant and the model). Rolling
Forcing's (``rolling-forcing``) runs its own sampler (model/wan/rolling.py ``run_blocks``): one
window forward and one commit a tick, a session's first block after 5 ticks.
``bash bench/gpu_wan_recipes.sh OUT_DIR`` runs every recipe once (the GPU run of
docs/performance.md); ``TINY=1`` runs it at the tiny size on the CPU.

``--vae tae`` decodes with TAEHV's decoder (model/wan/tae.py, its published widths, random
weights) instead of the Wan2.1 VAE: the rows' dec ms and VAE MiB and the summary's decode_share
are then TAEHV's (Matrix-Game's image condition still goes through the full VAE's encoder).

``--tiny`` runs the same loop on the CPU at a tiny size, with the recipe's settings (how the
bench is tested).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import AutoencoderKLWan

from worldserve.model.wan import recipes
from worldserve.model.wan.action import ActionKVCache
from worldserve.model.wan.cache import WanChunkContext, WanKVCache
from worldserve.model.wan.causal import CausalWanModel, TextKV
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.rolling import InFlight, run_blocks
from worldserve.model.wan.sampler import generate_chunk
from worldserve.model.wan.tae import TAE_WIDTHS, TaeDecoder, build_decoder
from worldserve.model.wan.vae_stream import (
    WAN21_VAE_CONFIG,
    StreamingDecoder,
    VaeStream,
    feature_cache_bytes,
)

MODELS = ("wan-causal", "matrix-game-2")
TARGET_FPS = 16.0
MIB = 2**20

# UMT5-XXL's encoder (google/umt5-xxl, as Wan2.1 uses it).
UMT5_XXL = dict(
    vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
    relative_attention_num_buckets=32, relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu", dropout_rate=0.0,
)
# CLIP ViT-H/14's vision tower (open-clip's ViT-H-14 as Wan's image encoder uses it, in
# transformers' CLIPVisionConfig terms): 632M parameters, 257 tokens of 1280.
CLIP_VIT_H = dict(
    hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
    image_size=224, patch_size=14, hidden_act="gelu",
)
TINY_VAE = dict(
    base_dim=4, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True],
    latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
)


@dataclass(frozen=True)
class Setup:
    cfg: WanConfig
    vae_config: dict
    text_config: dict  # the UMT5 encoder's (t2v); the CLIP vision tower's (i2v: Matrix-Game)
    height: int  # pixels
    width: int
    device: torch.device
    dtype: torch.dtype
    vae: str = "full"  # the decoder: the Wan2.1 VAE, or "tae" (TAEHV)

    @property
    def image(self) -> bool:
        """Conditioned on an image and actions (Matrix-Game), not a prompt."""
        return self.cfg.model_type == "i2v"

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // 8, self.width // 8


@dataclass
class Row:
    sessions: int
    gen_ms: float  # steps + commit, one chunk of every session
    dec_ms: float  # streaming decode of that chunk, every session
    overlap_ms: float | None  # a chunk end to end with the decode on a side stream (CUDA)
    frames_per_chunk: int  # pixel frames a session gets from one steady chunk
    kv_mib: float  # per session: the KV cache and the action caches
    vae_mib: float  # per session
    peak_gib: float | None  # device memory high-water mark (CUDA)

    @property
    def serial_ms(self) -> float:
        return self.gen_ms + self.dec_ms

    @property
    def chunk_ms(self) -> float:
        return min(self.serial_ms, self.overlap_ms) if self.overlap_ms is not None else self.serial_ms

    @property
    def fps_session(self) -> float:
        return 1000.0 * self.frames_per_chunk / self.chunk_ms

    @property
    def fps_total(self) -> float:
        return self.sessions * self.fps_session

    @property
    def key_ms_p50(self) -> float:
        """Key-to-frame estimate: half a period waiting for the next chunk, then the chunk."""
        return self.serial_ms + self.chunk_ms / 2

    @property
    def key_ms_max(self) -> float:
        return self.serial_ms + self.chunk_ms


@dataclass
class RollingSession:
    """What Rolling Forcing's sampler (model/wan/rolling.py ``run_blocks``) reads of a session."""

    slot: int
    text: TextKV
    gen: torch.Generator
    flight: InFlight | None = None


@dataclass
class Sessions:
    """N sessions' device state, one batch: their cache slots, VAE streams, conditioning."""

    cache: WanKVCache
    slots: list[int]
    streams: list[VaeStream]
    context: TextKV  # the prompts' or the anchor images' cross-attention K/V
    actions: ActionKVCache | None = None  # Matrix-Game's keyboard and mouse caches
    cond: torch.Tensor | None = None  # (N, cond_dim, F, h, w) the anchor images' condition
    rolling: list[RollingSession] | None = None  # Rolling Forcing's sessions: their window in flight

    @property
    def state_bytes(self) -> int:
        kv = (self.cache.k.numel() + self.cache.v.numel()) * self.cache.k.element_size()
        return kv + (self.actions.nbytes() if self.actions is not None else 0)

    def dispose(self) -> None:
        for st in self.streams:
            st.dispose()


class Bench:
    """The three models, random weights on the device, and the loops that time them."""

    def __init__(self, setup: Setup) -> None:
        from transformers import CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

        from worldserve.model.wan.clip import ImageEncoder

        self.s = setup
        dev, dt = setup.device, setup.dtype
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dt)  # built in the serving dtype on the device: 1.3B + 5.7B parameters
        try:
            with torch.device(dev):
                self.model = CausalWanModel(setup.cfg).eval()
                self.decoder: StreamingDecoder | TaeDecoder = StreamingDecoder(
                    AutoencoderKLWan(**setup.vae_config).eval())
                if setup.vae == "tae":  # TAEHV decodes; the full VAE stays for Matrix-Game's condition
                    widths = TAE_WIDTHS if setup.device.type == "cuda" else (8, 8, 4, 4)  # --tiny on the CPU
                    net = build_decoder(setup.cfg.out_dim, widths).eval()
                    self.decoder = TaeDecoder(net, encoder=self.decoder if setup.image else None)
                if setup.image:
                    self.clip = ImageEncoder(CLIPVisionModel(CLIPVisionConfig(**setup.text_config)))
                else:
                    self.text = UMT5EncoderModel(UMT5Config(**setup.text_config)).eval()
        finally:
            torch.set_default_dtype(default)
        self.sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        self.rng = np.random.default_rng(0)

    def prompt(self, batch: int) -> torch.Tensor:
        """One text-encoder pass (a cache miss) over ``batch`` random prompts: (B, text_len, text_dim)."""
        c = self.s.cfg
        ids = torch.randint(3, self.s.text_config["vocab_size"], (batch, c.text_len), device=self.s.device)
        mask = torch.ones_like(ids)
        mask[:, c.text_len // 4:] = 0  # a prompt a quarter of text_len long, zero past it
        out = self.text(input_ids=ids, attention_mask=mask).last_hidden_state
        return out * mask.unsqueeze(-1).to(out.dtype)

    def image(self) -> np.ndarray:
        return self.rng.integers(0, 256, (self.s.height, self.s.width, 3), dtype=np.uint8)

    def image_context(self, n: int) -> tuple[TextKV, torch.Tensor]:
        """The anchor images of ``n`` new sessions: CLIP tokens through img_emb, and their VAE
        condition (N, cond_dim, chunk_frames, h, w), as a session's first chunk reads it."""
        from worldserve.model.wan.matrix_game import image_condition

        tokens, conds = [], []
        for _ in range(n):
            image = self.image()
            tokens.append(self.clip.encode(image).to(self.s.device, self.s.dtype))
            conds.append(image_condition(self.decoder, image)[:, : self.s.cfg.chunk_frames].to(self.s.dtype))
        return self.model.image_kv(torch.cat(tokens)), torch.stack(conds)

    def context(self, n: int) -> tuple[TextKV, torch.Tensor | None]:
        """New sessions' conditioning: the prompts' K/V (a text-cache miss), or the anchor
        images' K/V and condition."""
        return self.image_context(n) if self.s.image else (self.model.text_kv(self.prompt(n)), None)

    def session_batch(self, n: int) -> Sessions:
        h, w = self.s.latent_hw
        cache = WanKVCache.create(self.s.cfg, h, w, n, dtype=self.s.dtype, device=self.s.device)
        slots = [cache.allocate() for _ in range(n)]
        streams = [self.decoder.open() for _ in range(n)]
        context, cond = self.context(n)
        actions = ActionKVCache.create(self.s.cfg, cache) if self.s.image else None
        rolling = None
        if self.s.cfg.sampler == "rolling":  # one prompt pass each: run_blocks batches the sessions' own K/V
            rolling = [RollingSession(s, self.model.text_kv(self.prompt(1)),
                                      torch.Generator(device=self.s.device).manual_seed(i))
                       for i, s in enumerate(slots)]
        return Sessions(cache, slots, streams, context, actions, cond, rolling)

    def inputs(self, b: Sessions, ctx: WanChunkContext) -> dict[str, object]:
        """A chunk's image condition and fresh action windows from the host, as served."""
        if b.actions is None:
            return {}
        a = b.actions.cfg
        shape = (ctx.batch, ctx.num_frames, a.window_pixel_frames)
        keyboard = torch.from_numpy(self.rng.integers(0, 2, (*shape, a.keyboard_dim_in)).astype(np.float32))
        mouse = torch.from_numpy(self.rng.uniform(-0.1, 0.1, (*shape, a.mouse_dim_in)).astype(np.float32))
        act = b.actions.chunk(ctx, keyboard.to(self.s.device, self.s.dtype),
                              mouse.to(self.s.device, self.s.dtype) if a.enable_mouse else None)
        return {"cond": b.cond, "act": act}

    def chunk(self, b: Sessions) -> torch.Tensor:
        """One chunk of every session: the steps and the commit; x0 (N, C, F, h, w). Rolling
        Forcing: one window forward and one commit a tick (a session's first block: 5 ticks)."""
        if b.rolling is not None:
            return run_blocks(self.model, b.cache, b.rolling).to(self.s.dtype)
        ctx = b.cache.chunk(b.slots)
        return generate_chunk(self.model, ctx, b.context, self.noise(len(b.slots)), **self.inputs(b, ctx))

    def noise(self, n: int) -> torch.Tensor:
        c = self.s.cfg
        h, w = self.s.latent_hw
        return torch.randn(n, c.out_dim, c.chunk_frames, h, w, device=self.s.device, dtype=self.s.dtype)

    @torch.inference_mode()
    def ttff(self) -> float:
        """A new session in a warm process: prompt pass (or the anchor image's CLIP pass and VAE
        condition), first chunk, its decode."""
        b = self.session_batch(1)  # its slot: a server's pool is allocated at startup
        self.sync()
        t0 = time.perf_counter()
        b.context, b.cond = self.context(1)
        frames = self.decoder.decode_batch(b.streams, self.chunk(b))
        self.sync()
        assert frames[0].shape[0] > 0
        return time.perf_counter() - t0

    @torch.inference_mode()
    def serial(self, n: int, chunks: int) -> tuple[float, float, int, float, float]:
        """Steady-state ms a chunk (generate, decode), pixel frames a chunk, KV (and action
        caches) and VAE MiB a session."""
        b = self.session_batch(n)
        fill = -(-self.s.cfg.cache_frames // self.s.cfg.chunk_frames)
        gen, dec = [], []
        frames = 0
        for c in range(fill + chunks):
            self.sync()
            t0 = time.perf_counter()
            x0 = self.chunk(b)
            self.sync()
            t1 = time.perf_counter()
            out = self.decoder.decode_batch(b.streams, x0)
            self.sync()
            t2 = time.perf_counter()
            if c >= fill:
                gen.append(t1 - t0)
                dec.append(t2 - t1)
                frames = out[0].shape[0]
        kv, vae = b.state_bytes / n, b.streams[0].cache_bytes
        b.dispose()
        return 1000 * statistics.median(gen), 1000 * statistics.median(dec), frames, kv / MIB, vae / MIB

    @torch.inference_mode()
    def overlapped(self, n: int, chunks: int) -> float:
        """Steady-state ms a chunk with chunk c's decode on a side stream while chunk c+1 generates."""
        b = self.session_batch(n)
        side = torch.cuda.Stream(device=self.s.device)
        fill = -(-self.s.cfg.cache_frames // self.s.cfg.chunk_frames)
        t_start = 0.0
        for c in range(fill + chunks):
            if c == fill:
                torch.cuda.synchronize()
                t_start = time.perf_counter()
            x0 = self.chunk(b)
            ready = torch.cuda.Event()
            ready.record()
            with torch.cuda.stream(side):
                side.wait_event(ready)
                x0.record_stream(side)
                self.decoder.decode_batch(b.streams, x0)
        torch.cuda.synchronize()
        b.dispose()
        return 1000 * (time.perf_counter() - t_start) / chunks

    def row(self, n: int, chunks: int, overlap: bool) -> Row:
        if self.s.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.s.device)
        gen, dec, frames, kv, vae = self.serial(n, chunks)
        ovl = self.overlapped(n, chunks) if overlap and self.s.device.type == "cuda" else None
        peak = torch.cuda.max_memory_allocated(self.s.device) / 2**30 if self.s.device.type == "cuda" else None
        return Row(n, gen, dec, ovl, frames, kv, vae, peak)


def summary(rows: list[Row], ttff_s: float, *, key: bool = False) -> str:
    """The last line; ``key``: with the key-to-frame estimate at N = 1 (Matrix-Game)."""
    one = rows[0]
    assert one.sessions == 1, "the first row is one session"
    at_target = [r.sessions for r in rows if r.fps_session >= TARGET_FPS]
    line = (
        f"gpu_wan fps_1={one.fps_session:.2f} ttff_s={ttff_s:.3f} "
        f"sessions_at_16fps={max(at_target, default=0)} "
        f"batching_gain={rows[-1].fps_total / one.fps_session:.2f} "
        f"decode_share={one.dec_ms / one.serial_ms:.3f}"
    )
    return line + (f" key_ms_p50={one.key_ms_p50:.1f}" if key else "")


def make_setup(args: argparse.Namespace) -> Setup:
    if args.model == "matrix-game-2":
        return make_mg_setup(args)
    if args.tiny:  # the recipe's steps, chunk, sinks, window and sampler on a tiny model
        cfg = WanConfig.tiny(**(recipes.get(args.recipe).config_fields() if args.recipe else {}))
        text = dict(vocab_size=64, d_model=cfg.text_dim, d_kv=8, d_ff=2 * cfg.text_dim, num_layers=1,
                    num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                    feed_forward_proj="gated-gelu", dropout_rate=0.0)
        vae = dict(TINY_VAE, z_dim=cfg.in_dim, latents_mean=[0.0] * cfg.in_dim, latents_std=[1.0] * cfg.in_dim)
        return Setup(cfg, vae, text, args.height or 32, args.width or 48, torch.device("cpu"), torch.float32)
    if not torch.cuda.is_available():
        raise SystemExit("worldserve.bench.gpu_wan needs a CUDA GPU at the real sizes; --tiny runs it on the CPU")
    dtype = getattr(torch, args.dtype)
    fields = recipes.get(args.recipe).config_fields() if args.recipe else {}
    return Setup(WanConfig.wan_1_3b(**fields), dict(WAN21_VAE_CONFIG), dict(UMT5_XXL), args.height or 480,
                 args.width or 832, torch.device("cuda"), dtype)


def make_mg_setup(args: argparse.Namespace) -> Setup:
    """Matrix-Game 2.0 (the universal variant, its inference recipe) at 352x640, or tiny."""
    if args.tiny:
        cfg = WanConfig.tiny_matrix_game(**(recipes.get(args.recipe).config_fields() if args.recipe else {}))
        clip = dict(hidden_size=cfg.image_dim, intermediate_size=2 * cfg.image_dim, num_hidden_layers=2,
                    num_attention_heads=2, image_size=28, patch_size=14)
        vae = dict(TINY_VAE, z_dim=cfg.out_dim, latents_mean=[0.0] * cfg.out_dim, latents_std=[1.0] * cfg.out_dim)
        return Setup(cfg, vae, clip, args.height or 32, args.width or 48, torch.device("cpu"), torch.float32)
    if not torch.cuda.is_available():
        raise SystemExit("worldserve.bench.gpu_wan needs a CUDA GPU at the real sizes; --tiny runs it on the CPU")
    return Setup(WanConfig.matrix_game_2(mg_variant(args.recipe)), dict(WAN21_VAE_CONFIG), dict(CLIP_VIT_H),
                 args.height or 352, args.width or 640, torch.device("cuda"), getattr(torch, args.dtype))


def mg_variant(recipe: str | None) -> str:
    variant = recipes.get(recipe or "matrix-game-2").variant
    assert variant is not None
    return variant


def per_session_line(model: str, recipe: str | None = None) -> str:
    """What a session holds at the real size, from the shapes (bf16)."""
    if model == "matrix-game-2":
        c = WanConfig.matrix_game_2(mg_variant(recipe))
        a = c.action_config
        assert a is not None
        t, p, la = c.tokens_per_frame(44, 80), c.cache_frames, len(a.blocks)
        kv = 2 * c.num_layers * p * t * c.dim * 2
        mouse = 2 * la * p * t * a.mouse_hidden_dim * 2
        keyboard = 2 * la * p * a.keyboard_hidden_dim * 2
        clip = 2 * c.num_layers * 257 * c.dim * 2
        return (f"per session at 352x640 bf16 (Matrix-Game 2.0, window {p} frames): KV cache {kv / MIB:.0f} MiB, "
                f"mouse cache {mouse / MIB:.0f} MiB, keyboard cache {keyboard / MIB:.1f} MiB, "
                f"CLIP K/V {clip / MIB:.0f} MiB, "
                f"VAE feature cache {feature_cache_bytes(WAN21_VAE_CONFIG, 352, 640) / MIB:.0f} MiB")
    real = WanConfig.wan_1_3b(**(recipes.get(recipe).config_fields() if recipe else {}))
    kv_real = 2 * real.num_layers * real.cache_frames * real.tokens_per_frame(60, 104) * real.dim * 2
    return (f"per session at 480x832 bf16 (Wan2.1-1.3B, sinks+window {real.cache_frames} frames): "
            f"KV cache {kv_real / MIB:.0f} MiB, "
            f"VAE feature cache {feature_cache_bytes(WAN21_VAE_CONFIG, 480, 832) / MIB:.0f} MiB")


def flash_attn_version() -> str:
    try:
        import flash_attn
    except ImportError:
        return "not installed (SDPA)"
    return str(getattr(flash_attn, "__version__", "installed"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=MODELS, default="wan-causal")
    ap.add_argument("--sessions", type=int, nargs="+", default=None,
                    help="session counts, one row each (default 1 2 4; matrix-game-2: 1 2 3 4)")
    ap.add_argument("--chunks", type=int, default=4, help="steady-state chunks timed per row")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--height", type=int, default=0, help="pixels (default 480, matrix-game-2 352; --tiny 32)")
    ap.add_argument("--width", type=int, default=0, help="pixels (default 832, matrix-game-2 640; --tiny 48)")
    ap.add_argument("--no-overlap", action="store_true", help="skip the side-stream decode rows")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model on the CPU")
    ap.add_argument("--vae", choices=["full", "tae"], default="full", help="the decoder: the Wan2.1 VAE or TAEHV")
    ap.add_argument("--recipe", choices=recipes.names(), help="a published checkpoint's settings")
    args = ap.parse_args(argv)
    if args.recipe:
        r = recipes.get(args.recipe)
        if r.refused:
            raise SystemExit(f"recipe {r.name} is not served: {r.refused}")
        args.model = r.family
    mg = args.model == "matrix-game-2"
    sessions = sorted(set(args.sessions or ([1, 2, 3, 4] if mg else [1, 2, 4])))
    if sessions[0] != 1:
        sessions = [1, *sessions]
    s = dataclasses.replace(make_setup(args), vae=args.vae)
    if s.height % 16 or s.width % 16:
        raise SystemExit(f"--height/--width must be multiples of 16 (VAE 8x, patch 2x), got {s.height}x{s.width}")

    c = s.cfg
    print(f"device: {torch.cuda.get_device_name() if s.device.type == 'cuda' else 'cpu'}, dtype {s.dtype}, "
          f"flash-attn {flash_attn_version()}, torch {torch.__version__}")
    bench = Bench(s)
    params = sum(p.numel() for p in bench.model.parameters())
    actions = "" if c.action_config is None else f"; action modules in {len(c.action_config.blocks)} blocks"
    print(f"model {args.model}: {params / 1e9:.2f}B parameters, dim {c.dim}, {c.num_layers} layers, "
          f"{c.num_heads} heads{actions}; chunk {c.chunk_frames} latent frames, "
          f"sinks {c.sink_frames} + window {c.window_frames}; {len(c.timesteps)} steps + commit; "
          f"{s.height}x{s.width} pixels, {c.tokens_per_frame(*s.latent_hw)} tokens a latent frame")
    print(per_session_line(args.model, args.recipe))
    if isinstance(bench.decoder, TaeDecoder):
        print(f"decoder: TAEHV ({sum(p.numel() for p in bench.decoder.net.parameters()) / 1e6:.1f}M parameters, "
              f"random weights)")

    bench.row(1, 1, overlap=False)  # warm-up: kernels, allocator
    ttff_s = bench.ttff()
    rows: list[Row] = []
    hdr = f"{'sessions':>8} {'gen ms':>9} {'dec ms':>9} {'serial ms':>9} {'overlap ms':>10} " \
          f"{'frames':>6} {'fps/sess':>8} {'fps all':>8} {'KV MiB':>8} {'VAE MiB':>8} {'peak GiB':>8}"
    if mg:
        hdr += f" {'key p50 ms':>10} {'key max ms':>10}"
    print(hdr)
    for n in sessions:
        try:
            r = bench.row(n, args.chunks, overlap=not args.no_overlap)
        except torch.cuda.OutOfMemoryError:
            print(f"{n:>8} out of device memory")
            break
        rows.append(r)
        ovl = f"{r.overlap_ms:10.1f}" if r.overlap_ms is not None else f"{'-':>10}"
        peak = f"{r.peak_gib:8.1f}" if r.peak_gib is not None else f"{'-':>8}"
        key = f" {r.key_ms_p50:10.1f} {r.key_ms_max:10.1f}" if mg else ""
        print(f"{n:>8} {r.gen_ms:9.1f} {r.dec_ms:9.1f} {r.serial_ms:9.1f} {ovl} {r.frames_per_chunk:>6} "
              f"{r.fps_session:8.2f} {r.fps_total:8.2f} {r.kv_mib:8.2f} {r.vae_mib:8.2f} {peak}{key}")
    first = "the image's CLIP pass and VAE condition" if mg else "prompt pass"
    print(f"ttff: {ttff_s * 1000:.0f} ms ({first} + first chunk of {c.chunk_frames} latent frames + its decode)")
    print(summary(rows, ttff_s, key=mg))


if __name__ == "__main__":
    main()
