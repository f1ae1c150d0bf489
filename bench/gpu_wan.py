"""The Wan2.1 causal family's serving speed: random weights at the real sizes, one session and
N sessions batched across clients.

    python -m bench.gpu_wan [--sessions 1 2 4] [--chunks 8] [--dtype bfloat16|float32]
                            [--height 480 --width 832] [--no-overlap] [--tiny] [--model wan-causal]

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

``--tiny`` runs the same loop on the CPU at a tiny size (how the bench is tested).
``--model matrix-game-2`` is the hook for the action-conditioned family; it is not served yet.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from diffusers import AutoencoderKLWan

from model.wan.cache import WanKVCache
from model.wan.causal import CausalWanModel
from model.wan.config import WanConfig
from model.wan.sampler import generate_chunk
from model.wan.vae_stream import WAN21_VAE_CONFIG, StreamingDecoder, feature_cache_bytes

MODELS = ("wan-causal", "matrix-game-2")
TARGET_FPS = 16.0
MIB = 2**20

# UMT5-XXL's encoder (google/umt5-xxl, as Wan2.1 uses it).
UMT5_XXL = dict(
    vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
    relative_attention_num_buckets=32, relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu", dropout_rate=0.0,
)
TINY_VAE = dict(
    base_dim=4, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True],
    latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
)


@dataclass(frozen=True)
class Setup:
    cfg: WanConfig
    vae_config: dict
    text_config: dict
    height: int  # pixels
    width: int
    device: torch.device
    dtype: torch.dtype

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
    kv_mib: float  # per session
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


class Bench:
    """The three models, random weights on the device, and the loops that time them."""

    def __init__(self, setup: Setup) -> None:
        from transformers import UMT5Config, UMT5EncoderModel

        self.s = setup
        dev, dt = setup.device, setup.dtype
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dt)  # built in the serving dtype on the device: 1.3B + 5.7B parameters
        try:
            with torch.device(dev):
                self.model = CausalWanModel(setup.cfg).eval()
                self.decoder = StreamingDecoder(AutoencoderKLWan(**setup.vae_config).eval())
                self.text = UMT5EncoderModel(UMT5Config(**setup.text_config)).eval()
        finally:
            torch.set_default_dtype(default)
        self.sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def prompt(self, batch: int) -> torch.Tensor:
        """One text-encoder pass (a cache miss) over ``batch`` random prompts: (B, text_len, text_dim)."""
        c = self.s.cfg
        ids = torch.randint(3, self.s.text_config["vocab_size"], (batch, c.text_len), device=self.s.device)
        mask = torch.ones_like(ids)
        mask[:, c.text_len // 4:] = 0  # a prompt a quarter of text_len long, zero past it
        out = self.text(input_ids=ids, attention_mask=mask).last_hidden_state
        return out * mask.unsqueeze(-1).to(out.dtype)

    def session_batch(self, n: int):
        h, w = self.s.latent_hw
        cache = WanKVCache.create(self.s.cfg, h, w, n, dtype=self.s.dtype, device=self.s.device)
        slots = [cache.allocate() for _ in range(n)]
        return cache, slots, [self.decoder.open() for _ in range(n)]

    def noise(self, n: int) -> torch.Tensor:
        c = self.s.cfg
        h, w = self.s.latent_hw
        return torch.randn(n, c.in_dim, c.chunk_frames, h, w, device=self.s.device, dtype=self.s.dtype)

    @torch.inference_mode()
    def ttff(self) -> float:
        """A new session in a warm process: prompt pass, first chunk, its decode."""
        cache, slots, streams = self.session_batch(1)
        self.sync()
        t0 = time.perf_counter()
        text = self.model.text_kv(self.prompt(1))
        x0 = generate_chunk(self.model, cache.chunk(slots), text, self.noise(1))
        frames = self.decoder.decode_batch(streams, x0)
        self.sync()
        assert frames[0].shape[0] > 0
        return time.perf_counter() - t0

    @torch.inference_mode()
    def serial(self, n: int, chunks: int) -> tuple[float, float, int, float, float]:
        """Steady-state ms a chunk (generate, decode), pixel frames a chunk, KV and VAE MiB a session."""
        cache, slots, streams = self.session_batch(n)
        text = self.model.text_kv(self.prompt(n))
        fill = -(-self.s.cfg.cache_frames // self.s.cfg.chunk_frames)
        gen, dec = [], []
        frames = 0
        for c in range(fill + chunks):
            self.sync()
            t0 = time.perf_counter()
            x0 = generate_chunk(self.model, cache.chunk(slots), text, self.noise(n))
            self.sync()
            t1 = time.perf_counter()
            out = self.decoder.decode_batch(streams, x0)
            self.sync()
            t2 = time.perf_counter()
            if c >= fill:
                gen.append(t1 - t0)
                dec.append(t2 - t1)
                frames = out[0].shape[0]
        kv = (cache.k.numel() + cache.v.numel()) * cache.k.element_size() / n
        vae = streams[0].cache_bytes
        for st in streams:
            st.dispose()
        return 1000 * statistics.median(gen), 1000 * statistics.median(dec), frames, kv / MIB, vae / MIB

    @torch.inference_mode()
    def overlapped(self, n: int, chunks: int) -> float:
        """Steady-state ms a chunk with chunk c's decode on a side stream while chunk c+1 generates."""
        cache, slots, streams = self.session_batch(n)
        text = self.model.text_kv(self.prompt(n))
        side = torch.cuda.Stream(device=self.s.device)
        fill = -(-self.s.cfg.cache_frames // self.s.cfg.chunk_frames)
        t_start = 0.0
        for c in range(fill + chunks):
            if c == fill:
                torch.cuda.synchronize()
                t_start = time.perf_counter()
            x0 = generate_chunk(self.model, cache.chunk(slots), text, self.noise(n))
            ready = torch.cuda.Event()
            ready.record()
            with torch.cuda.stream(side):
                side.wait_event(ready)
                x0.record_stream(side)
                self.decoder.decode_batch(streams, x0)
        torch.cuda.synchronize()
        for st in streams:
            st.dispose()
        return 1000 * (time.perf_counter() - t_start) / chunks

    def row(self, n: int, chunks: int, overlap: bool) -> Row:
        if self.s.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.s.device)
        gen, dec, frames, kv, vae = self.serial(n, chunks)
        ovl = self.overlapped(n, chunks) if overlap and self.s.device.type == "cuda" else None
        peak = torch.cuda.max_memory_allocated(self.s.device) / 2**30 if self.s.device.type == "cuda" else None
        return Row(n, gen, dec, ovl, frames, kv, vae, peak)


def summary(rows: list[Row], ttff_s: float) -> str:
    one = rows[0]
    assert one.sessions == 1, "the first row is one session"
    at_target = [r.sessions for r in rows if r.fps_session >= TARGET_FPS]
    return (
        f"gpu_wan fps_1={one.fps_session:.2f} ttff_s={ttff_s:.3f} "
        f"sessions_at_16fps={max(at_target, default=0)} "
        f"batching_gain={rows[-1].fps_total / one.fps_session:.2f} "
        f"decode_share={one.dec_ms / one.serial_ms:.3f}"
    )


def make_setup(args: argparse.Namespace) -> Setup:
    if args.tiny:
        cfg = WanConfig.tiny()
        text = dict(vocab_size=64, d_model=cfg.text_dim, d_kv=8, d_ff=2 * cfg.text_dim, num_layers=1,
                    num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                    feed_forward_proj="gated-gelu", dropout_rate=0.0)
        vae = dict(TINY_VAE, z_dim=cfg.in_dim, latents_mean=[0.0] * cfg.in_dim, latents_std=[1.0] * cfg.in_dim)
        return Setup(cfg, vae, text, args.height or 32, args.width or 48, torch.device("cpu"), torch.float32)
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu_wan needs a CUDA GPU at the real sizes; --tiny runs it on the CPU")
    dtype = getattr(torch, args.dtype)
    return Setup(WanConfig.wan_1_3b(), dict(WAN21_VAE_CONFIG), dict(UMT5_XXL), args.height or 480,
                 args.width or 832, torch.device("cuda"), dtype)


def flash_attn_version() -> str:
    try:
        import flash_attn
    except ImportError:
        return "not installed (SDPA)"
    return str(getattr(flash_attn, "__version__", "installed"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=MODELS, default="wan-causal")
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--chunks", type=int, default=4, help="steady-state chunks timed per row")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--height", type=int, default=0, help="pixels (default 480; --tiny 32)")
    ap.add_argument("--width", type=int, default=0, help="pixels (default 832; --tiny 48)")
    ap.add_argument("--no-overlap", action="store_true", help="skip the side-stream decode rows")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model on the CPU")
    args = ap.parse_args(argv)
    if args.model == "matrix-game-2":
        # Hook: Matrix-Game 2.0 shares the backbone and this loop; it needs its action modules
        # and image condition in model/ before it can be timed here.
        raise SystemExit("bench.gpu_wan: --model matrix-game-2 is not served yet")
    sessions = sorted(set(args.sessions))
    if sessions[0] != 1:
        sessions = [1, *sessions]
    s = make_setup(args)
    if s.height % 16 or s.width % 16:
        raise SystemExit(f"--height/--width must be multiples of 16 (VAE 8x, patch 2x), got {s.height}x{s.width}")

    c = s.cfg
    real = WanConfig.wan_1_3b()
    kv_real = 2 * real.num_layers * real.cache_frames * real.tokens_per_frame(60, 104) * real.dim * 2
    print(f"device: {torch.cuda.get_device_name() if s.device.type == 'cuda' else 'cpu'}, dtype {s.dtype}, "
          f"flash-attn {flash_attn_version()}, torch {torch.__version__}")
    print(f"model: dim {c.dim}, {c.num_layers} layers, {c.num_heads} heads; chunk {c.chunk_frames} latent frames, "
          f"sinks {c.sink_frames} + window {c.window_frames}; {len(c.timesteps)} steps + commit; "
          f"{s.height}x{s.width} pixels, {c.tokens_per_frame(*s.latent_hw)} tokens a latent frame")
    print(f"per session at 480x832 bf16 (Wan2.1-1.3B, sinks+window {real.cache_frames} frames): "
          f"KV cache {kv_real / MIB:.0f} MiB, "
          f"VAE feature cache {feature_cache_bytes(WAN21_VAE_CONFIG, 480, 832) / MIB:.0f} MiB")

    bench = Bench(s)
    bench.row(1, 1, overlap=False)  # warm-up: kernels, allocator
    ttff_s = bench.ttff()
    rows: list[Row] = []
    hdr = f"{'sessions':>8} {'gen ms':>9} {'dec ms':>9} {'serial ms':>9} {'overlap ms':>10} " \
          f"{'frames':>6} {'fps/sess':>8} {'fps all':>8} {'KV MiB':>8} {'VAE MiB':>8} {'peak GiB':>8}"
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
        print(f"{n:>8} {r.gen_ms:9.1f} {r.dec_ms:9.1f} {r.serial_ms:9.1f} {ovl} {r.frames_per_chunk:>6} "
              f"{r.fps_session:8.2f} {r.fps_total:8.2f} {r.kv_mib:8.2f} {r.vae_mib:8.2f} {peak}")
    print(f"ttff: {ttff_s * 1000:.0f} ms (prompt pass + first chunk of {c.chunk_frames} latent frames + its decode)")
    print(summary(rows, ttff_s))


if __name__ == "__main__":
    main()
