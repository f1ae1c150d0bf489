"""The trace cache: a restarted worker loads the traces it recorded before, and gets the same
frames; an entry that does not load is recorded again; a different model never hits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from worldserve.model.default import trace_recorder
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.trace_cache import TraceCache
from worldserve.model.default.trace_recorder import model_bytes
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan

TINY = ModelConfig(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)
SHAPES = [(64, 4, 1), (64, 4, 2)]


def _model(seed: int = 0) -> WorldModel:
    torch.manual_seed(seed)
    model = WorldModel(TINY)
    with torch.no_grad():  # off the identity init, so frames depend on every input
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _frames(runner: ModelRunner) -> list[np.ndarray]:
    ids = ["a", "b"]
    rng = np.random.default_rng(0)
    runner.execute(StepPlan(new_sessions=[
        SessionSpec(s, 64, seed=i, scene="", observation=rng.integers(0, 256, (64, 64, 3), np.uint8))
        for i, s in enumerate(ids)
    ]))
    out = []
    for c in range(TINY.cache_frames + 3):
        acts = np.full((1, ACTION_DIM), 0.3 * ((c % 3) - 1), np.float32)
        res = runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork(s, c, acts) for s in ids])]))
        assert not res.errors
        out += [r.frames for r in res.results]
    return out


def _no_children(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append(1)
        raise OSError("no child processes in this test")

    monkeypatch.setattr(trace_recorder.subprocess, "Popen", refuse)
    return calls


def test_a_restarted_runner_loads_its_traces_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ModelRunner(_model(), max_sessions=4, trace=True, trace_cache=tmp_path)
    first.prepare_shapes(SHAPES)  # recorded in children, kept
    assert len(list(tmp_path.glob("*.pt"))) == len(SHAPES)
    recorded = _frames(first)

    calls = _no_children(monkeypatch)
    again = ModelRunner(_model(), max_sessions=4, trace=True, trace_cache=tmp_path)
    again.prepare_shapes(SHAPES)
    assert calls == []  # nothing to record
    assert again.graphs is not None and all(again.graphs.has_trace(*s) for s in SHAPES)
    assert all(np.array_equal(a, b) for a, b in zip(recorded, _frames(again), strict=True))


def test_other_weights_do_not_hit_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ModelRunner(_model(0), max_sessions=4, trace=True, trace_cache=tmp_path).prepare_shapes(SHAPES)
    calls = _no_children(monkeypatch)
    other = ModelRunner(_model(1), max_sessions=4, trace=True, trace_cache=tmp_path)
    other.prepare_shapes(SHAPES)
    assert calls  # asked the children: the cached traces hold the other weights
    assert other.graphs is not None and not any(other.graphs.has_trace(*s) for s in SHAPES)


def test_an_entry_that_does_not_load_is_recorded_again(tmp_path: Path) -> None:
    model = _model()
    runner = ModelRunner(model, max_sessions=4, trace=True, trace_cache=tmp_path)
    cache = TraceCache(tmp_path, model_bytes(runner.model), runner.dtype)
    tmp_path.mkdir(exist_ok=True)
    cache.path(SHAPES[0]).write_bytes(b"not a trace")  # a torn write, a foreign file
    runner.prepare_shapes(SHAPES[:1])
    assert runner.graphs is not None and runner.graphs.has_trace(*SHAPES[0])
    assert cache.load(SHAPES[0]) is not None  # rewritten whole


def test_the_cache_keeps_under_its_limit(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path, b"model", torch.float32, limit_mb=0.0025)  # 2,500 bytes
    for n in range(1, 5):
        cache.store((64, 4, n), bytes(1000))
    kept = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert len(kept) == 2 and all(("-n3." in k) or ("-n4." in k) for k in kept)  # the newest
