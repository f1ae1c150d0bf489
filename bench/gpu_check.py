"""The model path on a CUDA GPU: correctness first, then speed. Needs a GPU; the CPU tests
cover the same paths on the host (and ``tests/model/test_device.py`` keeps every tensor on
the model's device).

    python -m bench.gpu_check [--weights PATH] [--batches 1 8 64 256] [--quick]

Checks (fp32 without TF32 unless named):
- ``kv_maxerr``: cached chunk-by-chunk generation against one full-sequence pass, as on
  the CPU (goal ≤ 1e-4);
- ``batch_vs_alone``: 4 sessions batched against each run alone, largest frame difference
  in 8-bit levels;
- ``cpu_vs_gpu``: one denoising forward on the same inputs on both, largest difference;
- ``bf16_rel``: the bf16 forward against fp32, ‖bf16 − fp32‖ / ‖fp32‖.
- ``graph_vs_eager``: the runner's chunks replayed as CUDA graphs (``model/default/chunk_graph.py``)
  against the eager path, same sessions, largest frame difference.
Speed (bf16): ms per denoising forward, eager against the replay of a captured CUDA graph
(the forward is a few hundred small kernels: launches, not arithmetic, set its time); ms
per whole chunk through the runner, eager against graphs; then the ``bench.model_step``
table on the GPU with the runner's chunks replayed as graphs. ``--quick``: the checks and
the whole-chunk table only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from worldserve.bench import model_step
from worldserve.model.attention import flash_available
from worldserve.model.default.consistency import cached_vs_full
from worldserve.model.default.kv_cache import KVCachePool
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.session.plan import Batch, ChunkWork, SessionSpec, StepPlan


def frames_of(runner: ModelRunner, ids: list[str], batched: bool, chunks: int) -> dict[str, np.ndarray]:
    cfg = runner.cfg
    out: dict[str, list[np.ndarray]] = {s: [] for s in ids}
    runner.execute(StepPlan(new_sessions=[SessionSpec(s, 64, seed=i, scene="a snowy forest")
                                          for i, s in enumerate(ids)]))
    for c in range(chunks):
        acts = {s: np.full((cfg.frames_per_chunk, cfg.action_dim), 0.1 * (i + 1) * (c % 3), np.float32)
                for i, s in enumerate(ids)}
        groups = [ids] if batched else [[s] for s in ids]
        for grp in groups:
            res = runner.execute(StepPlan(batches=[Batch(64, cfg.denoising_steps,
                                                         [ChunkWork(s, c, acts[s]) for s in grp])]))
            assert not res.errors, res.errors
            for r in res.results:
                out[r.session_id].append(r.frames)
    runner.execute(StepPlan(freed=ids))
    return {s: np.concatenate(v) for s, v in out.items()}


def forward_inputs(model: WorldModel, batch: int, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A denoising forward's inputs against a full cache (host-drawn, then moved)."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    pool = KVCachePool.create(cfg, 64, batch, model.rope, dtype, device)
    slots = [pool.allocate() for _ in range(batch)]
    shape = (cfg.depth, batch, cfg.kv_cache_tokens(64), cfg.heads, cfg.head_dim)
    pool.k[:, slots] = torch.randn(shape, generator=g).to(device, dtype)
    pool.v[:, slots] = torch.randn(shape, generator=g).to(device, dtype)
    pool.frame_at[slots] = np.arange(cfg.cache_frames)[None]  # every position filled
    ctx = pool.context(slots, np.full(batch, cfg.cache_frames))
    fshape = (batch, cfg.frames_per_chunk, cfg.channels, 64, 64)
    x = torch.randn(fshape, generator=g).to(device, dtype)
    prev = torch.randn(batch, cfg.frames_per_chunk, cfg.prev_channels, 64, 64, generator=g).to(device, dtype)
    act = torch.randn(batch, cfg.frames_per_chunk, cfg.action_dim, generator=g).to(device, dtype)
    scene = torch.randn(batch, cfg.scene_dim, generator=g).to(device, dtype)
    return x, model.prepare_chunk(prev, act, scene, (0.5,)), ctx


def cuda_ms(fn, reps: int = 50) -> float:
    """Median ms of ``fn`` by CUDA events."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


@torch.inference_mode()
def graph_speedup(model: WorldModel, batch: int, device: torch.device) -> tuple[float, float, float]:
    """(eager ms, graph-replay ms, max |graph − eager|) of one denoising forward."""
    x, inp, ctx = forward_inputs(model, batch, device, torch.bfloat16)
    step = lambda: model.denoise_step(x, inp, 0, ctx)  # noqa: E731
    eager_out = step().clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    graph.replay()
    torch.cuda.synchronize()
    diff = (static_out.float() - eager_out.float()).abs().max().item()
    return cuda_ms(step), cuda_ms(graph.replay), diff


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--quick", action="store_true", help="the checks and the whole-chunk table only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("worldserve.bench.gpu_check needs a CUDA GPU")
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"gpu: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"flash-attn {'installed' if flash_available(dev) else 'not installed (SDPA)'}")
    try:
        model_step.weights_or_init(args.weights)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    load = lambda: model_step.weights_or_init(args.weights)[0]  # noqa: E731

    gpu32 = load().to(dev)
    kv = cached_vs_full(gpu32, n_chunks=gpu32.cfg.cache_frames + 4, bucket=64)
    print(f"kv_maxerr (cuda fp32): {kv:.2e}")

    ids = [f"s{i}" for i in range(4)]
    eager = ModelRunner(load(), device=dev, max_sessions=8, graphs=False)
    together, alone = frames_of(eager, ids, True, 12), frames_of(eager, ids, False, 12)
    bva = max(int(np.abs(together[s].astype(int) - alone[s].astype(int)).max()) for s in ids)
    print(f"batch_vs_alone (cuda fp32, 4 sessions x 12 frames): max {bva} levels of 255")
    graphed = ModelRunner(load(), device=dev, max_sessions=8, graphs=True)
    replayed = frames_of(graphed, ids, True, 12)
    gve = max(int(np.abs(replayed[s].astype(int) - together[s].astype(int)).max()) for s in ids)
    print(f"graph_vs_eager (cuda fp32, chunks replayed as CUDA graphs): max {gve} levels of 255")

    with torch.inference_mode():
        cpu32 = load()
        xc, inp_c, ctx_c = forward_inputs(cpu32, 4, torch.device("cpu"), torch.float32)
        xg, inp_g, ctx_g = forward_inputs(gpu32, 4, dev, torch.float32)
        ref = cpu32.denoise_step(xc, inp_c, 0, ctx_c)
        got = gpu32.denoise_step(xg, inp_g, 0, ctx_g)
        print(f"cpu_vs_gpu (fp32 forward, batch 4): max {(got.cpu() - ref).abs().max().item():.2e}")
        bf = load().to(dev, torch.bfloat16)
        xb, inp_b, ctx_b = forward_inputs(bf, 4, dev, torch.bfloat16)
        out_b = bf.denoise_step(xb, inp_b, 0, ctx_b).float()
        rel = ((out_b - got).norm() / got.norm()).item()
        print(f"bf16_rel (bf16 forward vs fp32): {rel:.2e}")

    torch.backends.cuda.matmul.allow_tf32 = True
    if not args.quick:
        print(f"{'batch':>5} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'graph-eager':>12}")
        for b in args.batches:
            eager, graph, diff = graph_speedup(bf, b, dev)
            print(f"{b:>5} {eager:>9.3f} {graph:>9.3f} {eager / graph:>8.2f} {diff:>12.2e}", flush=True)

    print("whole chunks through the runner (bf16, bucket 64, 4 steps + commit + decode):")
    print(f"{'batch':>5} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'graph frames/s':>15}")
    runners = {g: ModelRunner(load(), device=dev, dtype=torch.bfloat16, max_sessions=max(args.batches), graphs=g)
               for g in (False, True)}
    for b in args.batches:
        t_eager = model_step.measure(runners[False], 64, b)[1] * 1e3
        t_graph = model_step.measure(runners[True], 64, b)[1] * 1e3
        print(f"{b:>5} {t_eager:>9.2f} {t_graph:>9.2f} {t_eager / t_graph:>8.2f} "
              f"{b * 1e3 / t_graph:>15.0f}", flush=True)

    if args.quick:
        return
    model_step.main(["--device", "cuda", "--cuda-graphs", "--dtype", "bfloat16", "--weights", str(args.weights),
                     "--batches", *map(str, args.batches)])


if __name__ == "__main__":
    main()
