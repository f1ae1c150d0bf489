"""Which float type the model runs in on this machine.

CPUs with native bf16 matrix instructions (AVX-512 BF16, AMX) multiply bf16 several times
faster than fp32; elsewhere bf16 is emulated and slower. ``pick_dtype("auto")`` reads the
CPU's flags where the OS lists them (Linux: ``avx512_bf16`` or ``amx_bf16`` in
/proc/cpuinfo), so the choice never depends on a noisy moment at start-up; where it cannot
tell, it times both on a matmul of the model's own shapes and takes bf16 only where it
clearly wins.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

DTYPES = ("auto", "float32", "bfloat16")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


def native_bf16(cpuinfo: Path | None = None) -> bool | None:
    """Whether this CPU has bf16 matrix instructions, from its flags (``cpuinfo``, default
    /proc/cpuinfo); None if unknown."""
    try:
        text = (cpuinfo or CPUINFO).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return not BF16_FLAGS.isdisjoint(value.split())
    return None


def matmul_gflops(
    dtype: torch.dtype, m: int, k: int, n: int, seconds: float = 0.2, device: str | torch.device = "cpu"
) -> float:
    """GFLOP/s of an (m, k) @ (k, n) matmul in ``dtype`` on the current threads (or GPU)."""
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    reps, t0 = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
        if reps % 16 == 0:
            sync()
    sync()
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def pick_dtype(name: str, width: int = 192, tokens: int = 128, device: str | torch.device = "cpu") -> torch.dtype:
    """``float32`` / ``bfloat16`` as named; ``auto`` on a GPU: bf16 where it supports it;
    ``auto`` on the CPU: bf16 where the CPU flags say it has
    bf16 matrix instructions (``native_bf16``), fp32 where they say it has not; where the
    flags are unknown, bf16 if a matmul of ``tokens`` x ``width`` x 4·``width`` runs at
    least 1.5x faster in bf16 than in fp32."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}")
    if name != "auto":
        return getattr(torch, name)
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    native = native_bf16()
    if native is not None:
        return torch.bfloat16 if native else torch.float32
    shape = (tokens, width, 4 * width)
    f32, bf16 = matmul_gflops(torch.float32, *shape), matmul_gflops(torch.bfloat16, *shape)
    return torch.bfloat16 if bf16 >= 1.5 * f32 else torch.float32
