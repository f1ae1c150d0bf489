"""What one canvas tile's decode costs, per tokenizer and float type.

    python -m bench.tile_decode [--tokenizer model/default/weights/tokenizer] [--beside T ...] [--repeats 15]

A tile is decoded as serving decodes it (``model/default/reference/canvas/tile_decode.py``): its 16x16 codes
with ``MARGIN`` codes of its neighbours around them, one tile a batch, on one thread (the
decoder's thread). Random codes and scene; the tokenizers take turns, so the host's load
falls on each alike. Prints the median milliseconds of each tokenizer in float32 and bf16,
and each one's ratio to the first.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from worldserve.model.default.reference.canvas.canvas import TILE
from worldserve.model.default.reference.canvas.tile_decode import MARGIN
from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS, load_tokenizer

DTYPES = (torch.float32, torch.bfloat16)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="The cost of one canvas tile's decode.")
    ap.add_argument("--tokenizer", type=Path, default=WEIGHTS, help="the tokenizer (no suffix)")
    ap.add_argument("--beside", type=Path, nargs="*", default=[], help="more tokenizers, timed in turn with it")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    paths = [args.tokenizer, *args.beside]
    side = TILE + 2 * MARGIN
    gen = torch.Generator().manual_seed(0)
    print(f"{'tokenizer':40s} {'dtype':>9s} {'ms/tile':>8s} {'ratio':>6s}")
    for dtype in DTYPES:
        models = [load_tokenizer(p).to(dtype) for p in paths]
        ids = torch.randint(0, models[0].cfg.codes, (1, side, side), generator=gen)
        scene = torch.randn(1, models[0].cfg.scene_dim, generator=gen).to(dtype)
        times: list[list[float]] = [[] for _ in models]
        for _ in range(args.repeats):
            for m, out in zip(models, times, strict=True):
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    m.decode(ids, scene)
                    out.append(time.perf_counter() - t0)
        med = [sorted(t)[len(t) // 2] * 1000 for t in times]
        for p, ms in zip(paths, med, strict=True):
            print(f"{p!s:40s} {str(dtype).removeprefix('torch.'):>9s} {ms:8.2f} {ms / med[0]:6.2f}")


if __name__ == "__main__":
    main()
