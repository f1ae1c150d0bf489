"""Chunks from fixed buffers (``model/default/chunk_graph.py``) give the eager path's frames.

On a GPU these buffers are captured as CUDA graphs (``bench.gpu_check`` checks the replay);
here the same buffers run eagerly, which holds the bookkeeping to the eager path: padding to
a power of two, the cache gathered into the graph's buffers, each session's noise drawn in
the same order, the mask of a cache still filling, and outputs copied out before the next
chunk overwrites them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldserve.model.default.chunk_graph import ChunkGraphs
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan

TINY = ModelConfig(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)


def test_a_batch_runs_in_the_smallest_recorded_graph_that_holds_it() -> None:
    graphs = ChunkGraphs(WorldModel(TINY), torch.float32, torch.device("cpu"))
    assert graphs.run_as(64, 4, 3) == 3  # nothing recorded: a graph of its own size
    for n in (1, 2, 4, 8):  # what a warm-up with the sizes 1 2 4 8 leaves
        graphs.get(64, 4, n)
    assert [graphs.run_as(64, 4, b) for b in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 9]
    assert graphs.run_as(64, 2, 3) == 3  # per bucket and step count
    assert graphs.run_as(128, 4, 3) == 3
    every = ChunkGraphs(WorldModel(TINY), torch.float32, torch.device("cpu"))
    for n in (1, 2, 3, 4):  # a warm-up of every size, smallest first: no batch has a pad row
        every.get(64, 4, n)
    assert [every.run_as(64, 4, b) for b in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert every.get(64, 4, 3).batch == 3


def _rollout(graphs: bool, plan: list[tuple[int, int]], trace: bool = False,
             recorded: tuple[tuple[int, int], ...] = (),
             prepared: tuple[tuple[int, int, int], ...] = ()) -> tuple[list[np.ndarray], ModelRunner]:
    """Frames of a rollout: ``plan`` lists (sessions in the batch, steps) per chunk;
    ``recorded`` the (steps, batch) graphs made before it, as a warm-up makes them;
    ``prepared`` the (bucket, steps, batch) shapes handed to ``prepare_shapes`` first."""
    torch.manual_seed(0)
    model = WorldModel(TINY)
    with torch.no_grad():  # off the identity init, so frames depend on every input
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    runner = ModelRunner(model, max_sessions=4, graphs=graphs, trace=trace)
    for steps, n in recorded:
        assert runner.graphs is not None
        runner.graphs.get(64, steps, n)
    if prepared:
        runner.prepare_shapes(list(prepared))
        assert runner.graphs is not None and all(runner.graphs.has_trace(*s) for s in prepared)
    ids = [f"s{i}" for i in range(max(n for n, _ in plan))]
    rng = np.random.default_rng(0)
    runner.execute(StepPlan(new_sessions=[
        SessionSpec(s, 64, seed=i, scene="snowy night", observation=rng.integers(0, 256, (64, 64, 3), np.uint8))
        for i, s in enumerate(ids)
    ]))
    frames: list[np.ndarray] = []
    for c, (n, steps) in enumerate(plan):
        acts = {s: np.full((1, ACTION_DIM), 0.3 * (i + 1) * ((c % 3) - 1), np.float32) for i, s in enumerate(ids)}
        out = runner.execute(StepPlan(batches=[Batch(64, steps, [ChunkWork(s, c, acts[s]) for s in ids[:n]])]))
        assert not out.errors
        frames += [r.frames for r in out.results]
    return frames, runner


def test_graph_path_gives_the_eager_frames_exactly() -> None:
    # the cache fills (masked graphs), then the steady state: graphs are made, reused and
    # switched between (4 sessions, 4 steps) and (2 sessions, 2 steps)
    plan = [(4, 4)] * (TINY.cache_frames + 3) + [(2, 2)] * 2 + [(4, 4)] * 2
    eager, _ = _rollout(False, plan)
    graphed, runner = _rollout(True, plan)
    assert runner.graphs is not None
    # each shape's two variants (filling, steady) are made together
    assert sorted(runner.graphs._graphs) == [(64, 2, 2, False), (64, 2, 2, True), (64, 4, 4, False), (64, 4, 4, True)]
    assert len(eager) == len(graphed) == 4 * (TINY.cache_frames + 5) + 4
    assert all(np.array_equal(a, b) for a, b in zip(eager, graphed, strict=True))
    assert all(a.std() > 0 for a in graphed) and not np.array_equal(graphed[-1], graphed[-2])


def test_every_generated_frame_takes_a_graph_once_the_anchor_is_in() -> None:
    # the observation is the sink frame: from the first generated chunk on, no eager chunk
    model = WorldModel(TINY)
    runner = ModelRunner(model, max_sessions=2, graphs=True)
    eager_chunks: list[int] = []
    run_chunk = runner._run_chunk

    def spy(bucket: int, steps: int, items: list[ChunkWork]) -> np.ndarray:
        if not runner._graphable([runner.sessions[it.session_id] for it in items]):
            eager_chunks.append(len(items))
        return run_chunk(bucket, steps, items)

    runner._run_chunk = spy  # type: ignore[method-assign]
    obs = np.zeros((64, 64, 3), np.uint8)
    runner.execute(StepPlan(new_sessions=[SessionSpec("a", 64, seed=0, scene="", observation=obs),
                                          SessionSpec("b", 64, seed=1, scene="")]))
    a = np.zeros((1, ACTION_DIM), np.float32)
    for c in range(TINY.cache_frames + 2):
        runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork("a", c, a)])]))
    assert eager_chunks == []
    runner.execute(StepPlan(batches=[Batch(64, 4, [ChunkWork("b", 0, a)])]))  # no anchor: frame 0 is a sink
    assert eager_chunks == [1]


def test_a_padded_batch_differs_by_rounding_alone() -> None:
    # 3 sessions run in a graph of 4 rows: other matmul shapes, so an 8-bit level may flip
    plan = [(3, 4)] * TINY.cache_frames  # the observation is frame 0: every chunk takes a graph
    eager, _ = _rollout(False, plan)
    graphed, runner = _rollout(True, plan, recorded=((4, 4),))
    assert runner.graphs is not None and sorted(runner.graphs._graphs) == [(64, 4, 4, False), (64, 4, 4, True)]
    diff = [np.abs(a.astype(int) - b.astype(int)) for a, b in zip(eager, graphed, strict=True)]
    assert max(d.max() for d in diff) <= 1 and np.mean([np.mean(d > 0) for d in diff]) < 0.01


def test_context_into_buffers_of_the_wrong_shape_is_refused() -> None:
    runner = ModelRunner(WorldModel(TINY), max_sessions=2)
    runner.execute(StepPlan(new_sessions=[SessionSpec("a", 64, seed=0, scene="")]))
    pool = runner.pools[64]
    bad = torch.zeros(TINY.depth, 1, 3, TINY.heads, TINY.head_dim)
    with pytest.raises(ValueError, match="do not hold"):
        pool.context([runner.sessions["a"].slot], np.array([1]), out=(bad, bad))


def test_every_shape_a_chunk_can_take_keeps_its_graph() -> None:
    # the server warms buckets x step counts x batch sizes; none may be dropped and recaptured
    runner = ModelRunner(WorldModel(TINY), max_sessions=256, graphs=True)
    assert runner.graphs is not None
    shapes = [(b, s, n, m) for b in TINY.buckets for s in range(TINY.min_steps, TINY.denoising_steps + 1)
              for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) for m in (False, True)]
    made = {k: runner.graphs.get(*k) for k in shapes}
    assert len(runner.graphs) == len(shapes) == 144
    assert all(runner.graphs.get(*k) is g for k, g in made.items())


def test_traced_chunks_give_the_eager_frames_to_rounding() -> None:
    # the CPU's TorchScript traces: the same kernels recorded once per shape; fusing a few of
    # them into one may round differently, never by more than an 8-bit level
    plan = [(4, 4)] * (TINY.cache_frames + 3) + [(2, 2)] * 2 + [(3, 4)] * 2
    eager, _ = _rollout(False, plan)
    traced, runner = _rollout(False, plan, trace=True)
    assert runner.graphs is not None and runner.graphs.mode == "trace"
    # the steady state only: batches with a cache still filling ran eagerly
    assert sorted(runner.graphs._graphs) == [(64, 2, 2, False), (64, 4, 4, False)]
    assert all(g._trace is not None for g in runner.graphs._graphs.values())  # recorded, not eager
    diff = [np.abs(a.astype(int) - b.astype(int)) for a, b in zip(eager, traced, strict=True)]
    assert max(d.max() for d in diff) <= 1 and np.mean([np.mean(d > 0) for d in diff]) < 0.01
    assert not np.array_equal(traced[-1], traced[-2])


def test_traces_recorded_in_a_child_process_give_the_same_frames() -> None:
    # a warm-up records its traces in a child process (trace_recorder) and loads them: the
    # frames are the ones a trace recorded in this process gives, bit for bit
    plan = [(2, 4)] * (TINY.cache_frames + 3) + [(1, 4)] * 2
    here, _ = _rollout(False, plan, trace=True)
    loaded, runner = _rollout(False, plan, trace=True, prepared=((64, 4, 1), (64, 4, 2)))
    assert all(np.array_equal(a, b) for a, b in zip(here, loaded, strict=True))
    assert runner.graphs is not None and len(runner.graphs) == 2  # nothing recorded again


def test_a_warm_up_whose_child_cannot_record_records_the_traces_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from worldserve.model.default import trace_recorder
    from worldserve.session.warmup import warm_up

    def no_child(*args: object, **kwargs: object) -> None:
        raise OSError("no processes left")

    monkeypatch.setattr(trace_recorder.subprocess, "Popen", no_child)
    runner = ModelRunner(WorldModel(TINY), max_sessions=4, trace=True)
    timings = warm_up(runner, (64,), (4,), (1, 2))  # the server still becomes ready
    assert {(t.size, t.steps) for t in timings} == {(1, 4), (2, 4)}
    assert runner.graphs is not None and runner.graphs.has_trace(64, 4, 1) and runner.graphs.has_trace(64, 4, 2)


def test_a_traced_rollout_repeats_bit_for_bit() -> None:
    # what replay and an exact migration rest on: the same inputs, the same frames
    plan = [(2, 4)] * (TINY.cache_frames + 3)
    first, _ = _rollout(False, plan, trace=True)
    again, _ = _rollout(False, plan, trace=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))


def test_a_trace_runs_its_kernels_without_python_between_them() -> None:
    # What lets the engine's thread leave the GIL to the event loop: an eager chunk runs
    # Python (module calls) between its kernels and takes the GIL back for each; a traced
    # chunk is one call into TorchScript, which runs every kernel with the GIL released.
    # Counted in Python calls (deterministic); bench.gil_contention times the effect.
    import sys

    from worldserve.model.default.chunk_graph import ChunkGraph

    model = WorldModel(ModelConfig(width=96, depth=4, heads=2, time_rope_dims=8))
    model.requires_grad_(False)
    graph = ChunkGraph(model, 64, 4, 8, torch.float32, torch.device("cpu"), "trace")
    graph.run()  # recorded and warmed

    def python_calls() -> int:
        calls = 0

        def count(frame: object, event: str, arg: object) -> None:
            nonlocal calls
            calls += event == "call"

        with torch.inference_mode():
            sys.setprofile(count)
            try:
                graph.run()
            finally:
                sys.setprofile(None)
        return calls

    traced = python_calls()
    graph.mode = "eager"
    eager = python_calls()
    assert eager > 4 * 10  # every block's modules, at least
    assert traced * 10 < eager, (traced, eager)
