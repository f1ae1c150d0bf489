"""Model step speed: ms per denoising forward, frames/s and efficiency per bucket and batch size.

    python -m bench.model_step [--threads N] [--dtype auto|float32|bfloat16] [--weights PATH]
                               [--device cpu|cuda] [--cuda-graphs] [--no-cpu-trace] [--batches 1 2 4 8 16] [--compile]
                               [--moving]

First measures this machine's matmul peak (GFLOP/s, same dtype and threads), then for each
resolution bucket and batch size prints ms per denoising forward, frames/s with the full step
count (all denoising forwards + the commit forward + decode), achieved GFLOP/s of the denoising
forward and efficiency (achieved / peak). The last line is a summary::

    model_step bucket=<smallest> batch_gain_b8=<x> efficiency_b8=<x> kv_maxerr=<x>
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from worldserve.model.default.consistency import cached_vs_full
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS, load_model
from worldserve.model.dtype import DTYPES, matmul_gflops, pick_dtype
from worldserve.session.plan import KEYS, ChunkWork, SessionSpec, StepPlan

BATCHES = (1, 2, 4, 8, 16)
CPU = torch.device("cpu")


# with a chunk costing F + B * P, the gain at batch 8 is 8 (F + P) / (F + 8 P): 2.5 at F / P = 12 / 5.5
GAIN_RATIO = (8 * 2.5 - 8) / (8 - 2.5)


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...] = (512, 1024), trials: int = 3,
                seconds: float = 0.4, device: torch.device = CPU) -> float:
    """The best GFLOP/s of square matmuls over a few sizes and trials, after a warm-up: a
    single cold trial can read half the real peak (clock ramp, a noisy neighbour), and an
    efficiency above 1 would follow. A GPU needs far bigger matmuls to reach its peak."""
    if device.type == "cuda":
        sizes = (4096, 8192)
    matmul_gflops(dtype, sizes[-1], sizes[-1], sizes[-1], seconds, device)  # warm-up: let the clock ramp
    return max(matmul_gflops(dtype, n, n, n, seconds, device) for n in sizes for _ in range(trials))


def timed(fn, min_seconds: float = 0.6, min_reps: int = 3, device: torch.device = CPU) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    reps, t0 = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - t0 < min_seconds:
        fn()
        reps += 1
    sync()
    return (time.perf_counter() - t0) / reps


def measure(
    runner: ModelRunner, bucket: int, batch: int, compiled: bool = False, moving: bool = False,
) -> tuple[float, float, float, float]:
    """(seconds per denoising forward, seconds per whole chunk, FLOPs per denoising forward,
    seconds per denoising forward compiled by ``torch.compile`` (NaN unless ``compiled``)).
    ``moving``: the chunks' camera moves right and turns, so what the serving path does for
    ground entering the view (recall, the canvas's writes) is in the chunk's time."""
    cfg = runner.cfg
    ids = [f"bench{i}" for i in range(batch)]
    runner.execute(StepPlan(new_sessions=[SessionSpec(s, bucket, seed=i, scene="") for i, s in enumerate(ids)]))
    actions = np.zeros((cfg.frames_per_chunk, cfg.action_dim), np.float32)
    if moving:
        actions[:, KEYS.index("right")] = 1.0
        actions[:, cfg.num_keys] = 0.3
    items = [ChunkWork(s, 0, actions) for s in ids]
    try:
        with torch.inference_mode():
            for _ in range(cfg.cache_frames + 1):  # fill the cache: the steady state
                runner._run_chunk(bucket, cfg.denoising_steps, items)
            states = [runner.sessions[s] for s in ids]
            pool = runner.pools[bucket]
            ctx = pool.context([s.slot for s in states], np.array([s.frame_index for s in states]))
            shape = (batch, cfg.frames_per_chunk, cfg.channels, bucket, bucket)
            dev, dt = runner.device, runner.dtype
            x = torch.randn(shape, dtype=dt, device=dev)
            prev = torch.randn(*shape[:2], cfg.prev_channels, bucket, bucket, dtype=dt, device=dev)
            act = torch.zeros(batch, cfg.frames_per_chunk, cfg.action_dim, dtype=dt, device=dev)
            scene = torch.zeros(batch, cfg.scene_dim, dtype=dt, device=dev)
            step = lambda: runner.model.denoise_chunk(x, prev, 0.5, act, scene, ctx)  # noqa: E731
            with FlopCounterMode(display=False) as counter:
                step()
            t_fwd = timed(step, device=dev)
            t_chunk = timed(lambda: runner._run_chunk(bucket, cfg.denoising_steps, items), device=dev)
            t_comp = float("nan")
            if compiled:  # one graph per shape, weights frozen in (inductor; C++ on a CPU)
                fn = torch.compile(runner.model.denoise_chunk, dynamic=False)
                t_comp = timed(lambda: fn(x, prev, 0.5, act, scene, ctx), device=dev)
    finally:
        runner.execute(StepPlan(freed=ids))
    return t_fwd, t_chunk, float(counter.get_total_flops()), t_comp


def weights_or_init(weights: Path) -> tuple[WorldModel, str]:
    """The model at ``weights`` (with or without the ``.safetensors`` suffix) and its name;
    a randomly initialised default model only where the default weights are absent (a
    checkout without them). Named weights that are not there are an error, never a
    silent random model."""
    path = Path(weights).with_suffix(".safetensors")
    if path.exists():
        return load_model(path), str(path)
    if path == DEFAULT_WEIGHTS.with_suffix(".safetensors"):
        return WorldModel(ModelConfig()), "random init (no weights file)"
    raise FileNotFoundError(f"no weights at {path}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--dtype", default="auto", choices=DTYPES)
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="time whole chunks as the runner replays them from CUDA graphs")
    ap.add_argument("--cpu-trace", action=argparse.BooleanOptionalAction, default=True,
                    help="time whole chunks as the server runs them on the CPU: TorchScript traces")
    ap.add_argument("--compile", action="store_true",
                    help="also time the denoising forward compiled by torch.compile (minutes of compiling)")
    ap.add_argument("--moving", action="store_true",
                    help="time chunks of a moving, turning camera (the edge work of recall and the canvas)")
    args = ap.parse_args(argv)
    if args.compile:
        import torch._inductor.config as inductor

        inductor.freezing = True  # weights as constants: what inference compiles with
    if args.cuda_graphs and not args.device.startswith("cuda"):
        ap.error("--cuda-graphs needs --device cuda")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = pick_dtype(args.dtype, device=device)
    try:
        model, source = weights_or_init(args.weights)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    cfg = model.cfg
    params = sum(p.numel() for p in model.parameters())
    peak = matmul_peak(dtype, device=device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{args.threads} threads"
    print(f"model: {source}, {params / 1e6:.2f}M params, depth {cfg.depth}, width {cfg.width}, "
          f"{cfg.denoising_steps} steps + commit, dtype {str(dtype).removeprefix('torch.')}, {where}")
    print(f"matmul peak: {peak:.1f} GFLOP/s (best square matmul, same dtype and {where})")
    m, k, n = 8 * cfg.tokens_per_chunk(cfg.buckets[0]), cfg.width, int(cfg.mlp_ratio * cfg.width)
    shaped = max(matmul_gflops(dtype, m, k, n, 0.4, device) for _ in range(3))
    print(f"matmul at the model's MLP shape, batch 8 ({m}x{k}x{n}): {shaped:.1f} GFLOP/s "
          f"({shaped / peak:.2f} of the peak)")
    runner = ModelRunner(model, dtype=dtype, max_sessions=max(args.batches), device=device, graphs=args.cuda_graphs,
                         trace=args.cpu_trace)
    print(f"{'bucket':>6} {'batch':>5} {'tokens':>6} {'ms/fwd':>8} {'ms/chunk':>9} {'frames/s':>9} "
          f"{'GFLOP/s':>8} {'eff':>5}" + (f" {'compiled ms/fwd':>15} {'eff':>5}" if args.compile else ""))
    throughput: dict[tuple[int, int], float] = {}
    eff: dict[tuple[int, int], float] = {}
    for bucket in cfg.buckets:
        chunk_ms = []
        for b in args.batches:
            t_fwd, t_chunk, flops, t_comp = measure(runner, bucket, b, args.compile, args.moving)
            fps = b * cfg.frames_per_chunk / t_chunk
            gflops = flops / t_fwd / 1e9
            throughput[bucket, b] = fps
            chunk_ms.append(t_chunk * 1e3)
            eff[bucket, b] = gflops / peak
            print(f"{bucket:>6} {b:>5} {b * cfg.tokens_per_chunk(bucket):>6} {t_fwd * 1e3:>8.2f} "
                  f"{t_chunk * 1e3:>9.2f} {fps:>9.1f} {gflops:>8.1f} {gflops / peak:>5.2f}"
                  + (f" {t_comp * 1e3:>15.2f} {flops / t_comp / 1e9 / peak:>5.2f}" if args.compile else ""),
                  flush=True)
        if len(set(args.batches)) > 1:  # a chunk ~ fixed + per-session x B: what batching amortizes
            per, fixed = np.polyfit(args.batches, chunk_ms, 1)
            print(f"bucket {bucket}: a chunk costs {fixed:.2f} ms + {per:.2f} ms a session (fit over batches "
                  f"{' '.join(map(str, args.batches))}); fixed / per-session {fixed / per:.2f} "
                  f"(batch_gain_b8 >= 2.5 needs >= {GAIN_RATIO:.2f})")
    small = cfg.buckets[0]
    fp32 = model.float()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the check is of fp32 arithmetic
    kv_err = cached_vs_full(fp32, n_chunks=cfg.cache_frames + 4, bucket=small)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    # batching pays when B sessions cost less than B times one: the total frames/s at B=8
    # over B=1 is the per-session gain (each session's frame costs 1/gain of running alone)
    gain = throughput.get((small, 8), float("nan")) / throughput[small, args.batches[0]]
    print(f"model_step bucket={small} batch_gain_b8={gain:.2f} "
          f"efficiency_b8={eff.get((small, 8), float('nan')):.2f} kv_maxerr={kv_err:.2e}")


if __name__ == "__main__":
    main()
