"""Whether two threads of this machine compute side by side or share one core's units.

    python -m bench.core_share [--seconds S]

Times, on one thread, a bf16 matmul loop (what the model and the canvas's tile decodes spend
their time in) and a numpy sort, alone and then with a second thread running the same loop.
A ratio near 1: the cores compute side by side, and work on a second thread is free while the
model thread runs. Near 2: they share their units, and a second thread's work slows the model
by as much as it does itself (``model/default/tile_decode.py`` runs its work between chunks for
this reason). Last line: ``core_share matmul_bf16=<ratio> sort=<ratio>``.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import numpy as np
import torch


def _loop(step: Callable[[], object], seconds: float) -> float:
    """Steps a second over ``seconds``, on the calling thread with one intra-op thread."""
    torch.set_num_threads(1)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    return n / (time.perf_counter() - t0)


def ratio(step: Callable[[], object], seconds: float) -> float:
    """Steps a second alone over steps a second with a second thread doing the same."""
    _loop(step, min(0.5, seconds))  # warm
    alone = _loop(step, seconds)
    other = threading.Thread(target=_loop, args=(step, seconds * 1.2))
    other.start()
    beside = _loop(step, seconds)
    other.join()
    return alone / beside


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Whether two threads compute side by side or share one core's units.")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    a = torch.randn(512, 512, dtype=torch.bfloat16)
    x = np.random.default_rng(0).random(2_000_000)
    mm = ratio(lambda: a @ a, args.seconds)
    sort = ratio(lambda: np.sort(x), args.seconds)
    print(f"{torch.get_num_interop_threads()} inter-op threads; each loop on one intra-op thread")
    print(f"core_share matmul_bf16={mm:.2f} sort={sort:.2f}")


if __name__ == "__main__":
    main()
