"""``bench.stream_batch``'s stream batch makes the frames the engine's chunk batches make: a
mixed forward carries each chunk at its own step (level, modulation, cache context), so what
the bench times is the same work done another way."""

from __future__ import annotations

import numpy as np
import torch

from worldserve.bench.stream_batch import BUCKET, Stream, open_sessions, steering
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.runner import ModelRunner
from worldserve.session.plan import ChunkWork

TINY = ModelConfig(width=48, depth=2, heads=2, time_rope_dims=8, window_frames=2, sink_frames=1)


def _runner() -> ModelRunner:
    torch.manual_seed(0)
    model = WorldModel(TINY)
    with torch.no_grad():  # off the identity init, so frames depend on every input
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return ModelRunner(model, max_sessions=8)


def _frames(steps: list[int], stream: bool, chunks: int = 5) -> list[np.ndarray]:
    """Frames of sessions at ``steps`` denoising steps each, made by one stream batch a
    frame, or by chunk batches (one per step count), from the same start."""
    runner = _runner()
    ids = open_sessions(runner, len(steps), "s")
    out = []
    with torch.inference_mode():
        for k in range(chunks):
            acts = steering(runner, k)
            if stream:
                st = Stream(runner)
                st.admit([(i, runner.sessions[s], acts, steps[i]) for i, s in enumerate(ids)])
                got: dict[int, np.ndarray] = {}
                while st.rows:
                    got.update(st.forward())
                out.append(np.stack([got[i] for i in range(len(ids))]))
            else:
                frames = {}
                for n in sorted(set(steps), reverse=True):
                    group = [i for i in range(len(ids)) if steps[i] == n]
                    made = runner._run_chunk(BUCKET, n, [ChunkWork(ids[i], k, acts) for i in group])
                    frames.update({i: made[j] for j, i in enumerate(group)})
                out.append(np.stack([frames[i] for i in range(len(ids))]))
    return out


def test_a_stream_batch_in_phase_makes_the_chunk_batchs_frames_exactly() -> None:
    for a, b in zip(_frames([4, 4, 4], stream=True), _frames([4, 4, 4], stream=False), strict=True):
        np.testing.assert_array_equal(a, b)


def test_chunks_at_different_steps_share_forwards_and_make_their_own_frames() -> None:
    steps = [4, 3, 2]
    stream, chunk = _frames(steps, stream=True), _frames(steps, stream=False)
    for a, b in zip(stream, chunk, strict=True):  # batch compositions differ: float rounding only
        diff = np.abs(a.astype(int) - b.astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.05
    # and the step count matters: the same session at 4 steps makes other frames
    assert np.abs(_frames([4, 4, 4], stream=True)[-1][1].astype(int) - stream[-1][1].astype(int)).mean() > 0.5
