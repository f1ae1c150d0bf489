"""Whether two threads of this machine compute side by side or share one core's units.

    python -m bench.core_share [--seconds S]

Times, on one thread, a bf16 and a float32 matmul loop (what the model and the canvas's tile
decodes spend their time in) and a numpy sort, alone and then with a second thread running the
same loop (``model/cores.py``).
A ratio near 1: the cores compute side by side, and work on a second thread is free while the
model thread runs. Near 2: they share their units, and a second thread's work slows the model
by as much as it does itself (``model/default/reference/canvas/tile_decode.py`` then runs its work between chunks,
``--canvas-decode``). Last line: ``core_share matmul_bf16=<ratio> matmul_fp32=<ratio> sort=<ratio>``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from worldserve.model.cores import matmul_share, share


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Whether two threads compute side by side or share one core's units.")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    x = np.random.default_rng(0).random(2_000_000)
    bf16 = matmul_share(torch.bfloat16, args.seconds, 512)
    fp32 = matmul_share(torch.float32, args.seconds, 512)
    sort = share(lambda: np.sort(x), args.seconds)
    print(f"{torch.get_num_interop_threads()} inter-op threads; each loop on one intra-op thread")
    print(f"core_share matmul_bf16={bf16:.2f} matmul_fp32={fp32:.2f} sort={sort:.2f}")


if __name__ == "__main__":
    main()
