"""Whether two threads of this machine compute side by side or share one core's units.

Work on a second thread (the world canvas's tile decodes, ``model/default/reference/canvas/tile_decode.py``)
is free while the model thread runs a chunk only where the two threads get a core each. On a
2-core Intel Xeon, at one time, a bf16 matmul loop ran 1.8x slower beside a second one (the
host's other tenants shared the cores); hours later the same machine read 1.00, and a 2-core
AMD EPYC read 0.98. ``share`` measures it: a loop's steps a second alone over its steps a
second with a second thread running the same loop (1: side by side; 2: one core's units
shared). ``bench.core_share`` prints it; the runner probes it at start-up to decide where the
canvas decodes (``decode_beside_chunks``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

SIDE_BY_SIDE = 1.3  # share below this: a second thread's work costs the model thread little


def _loop(step: Callable[[], object], seconds: float) -> float:
    """Steps a second over ``seconds``, on the calling thread with one intra-op thread (the
    calling thread's intra-op count is restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step()
            n += 1
        rate = n / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return rate


def share(step: Callable[[], object], seconds: float) -> float:
    """``step``'s rate alone over its rate with a second thread running it too."""
    _loop(step, min(0.5, seconds / 2))  # warm
    alone = _loop(step, seconds)
    other = threading.Thread(target=_loop, args=(step, seconds * 1.2), name="core-share")
    other.start()
    beside = _loop(step, seconds)
    other.join()
    return alone / beside


def matmul_share(dtype: torch.dtype, seconds: float, n: int = 256) -> float:
    """``share`` of an ``n`` x ``n`` matmul in ``dtype`` (the model's and the decodes' work)."""
    a = torch.randn(n, n).to(dtype)
    return share(lambda: a @ a, seconds)


def decode_beside_chunks(dtype: torch.dtype, seconds: float = 0.3) -> tuple[bool, float]:
    """Whether the canvas's decoder thread should work while the model thread runs a chunk
    (the cores compute side by side), and the share measured (``matmul_share``)."""
    s = matmul_share(dtype, seconds)
    return s < SIDE_BY_SIDE, s
