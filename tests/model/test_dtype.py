"""The model's float type: named, picked by timing, and bf16 runs the default weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import worldserve.model.dtype as md
from worldserve.model.default.runner import ModelRunner
from worldserve.model.dtype import pick_dtype
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan


def test_named_dtypes_and_a_clear_error_for_others() -> None:
    assert pick_dtype("float32") is torch.float32
    assert pick_dtype("bfloat16") is torch.bfloat16
    assert pick_dtype("auto") in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="'float16'"):
        pick_dtype("float16")


def test_default_weights_in_bf16_stay_close_to_fp32() -> None:
    frames = {}
    for dtype in ("float32", "bfloat16"):
        runner = ModelRunner.from_pretrained(dtype=dtype, max_sessions=2)
        assert runner.dtype is getattr(torch, dtype)
        runner.execute(StepPlan(new_sessions=[SessionSpec("s", 64, seed=3, scene="forest")]))
        act = np.zeros((1, ACTION_DIM), np.float32)
        act[0, 0] = 1.0  # forward
        out = [
            runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork("s", i, act)])])).results[0].frames
            for i in range(4)
        ]
        frames[dtype] = np.concatenate(out).astype(np.float64)
    err = np.sqrt(np.mean((frames["float32"] - frames["bfloat16"]) ** 2))
    assert err < 4.0, f"bf16 frames differ from fp32 by RMS {err:.1f} / 255"


def test_auto_follows_the_cpu_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert md.native_bf16(info) is True
    monkeypatch.setattr(md, "CPUINFO", info)
    assert pick_dtype("auto") is torch.bfloat16
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert pick_dtype("auto") is torch.float32
    assert md.native_bf16(tmp_path / "missing") is None


def test_auto_on_a_gpu_follows_its_bf16_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert pick_dtype("auto", device="cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert pick_dtype("auto", device="cuda:0") == torch.float32
