"""Cached chunk-by-chunk generation equals one full-sequence block-causal forward."""

from __future__ import annotations

import pytest
import torch

from tests.model.conftest import randomized, tiny_config
from worldserve.model.default.consistency import cached_vs_full
from worldserve.model.default.net.dit import sequence_mask


@pytest.mark.parametrize("fc", [1, 2])
def test_cached_generation_equals_full_sequence_after_window_wraps(fc: int) -> None:
    cfg = tiny_config(frames_per_chunk=fc, window_frames=2 * fc, sink_frames=1)
    # enough chunks for the ring to wrap several times, with a sink frame in place
    assert cached_vs_full(randomized(cfg), n_chunks=9, bucket=32) <= 1e-4


def test_cached_generation_equals_full_sequence_at_the_larger_bucket() -> None:
    cfg = tiny_config(sink_frames=2, window_frames=3)
    assert cached_vs_full(randomized(cfg), n_chunks=8, bucket=64) <= 1e-4


def test_cached_generation_equals_full_sequence_with_the_default_shapes() -> None:
    from worldserve.model.default.net.config import ModelConfig

    cfg = ModelConfig(depth=2)
    assert cached_vs_full(randomized(cfg), n_chunks=7, bucket=64) <= 1e-4


def test_sequence_mask_matches_what_the_cache_holds() -> None:
    cfg = tiny_config(sink_frames=1, window_frames=2)
    m = sequence_mask(cfg, torch.arange(6), torch.zeros(6, dtype=torch.bool))
    # frame 5 sees the sink 0, the window 3, 4 and itself; not 1 or 2
    assert m[5].tolist() == [True, False, False, True, True, True]
    assert not m[2, 3:].any()  # causal


def test_cached_generation_equals_full_sequence_with_an_anchor_reference() -> None:
    cfg = tiny_config()
    assert cached_vs_full(randomized(cfg), n_chunks=6, bucket=32) <= 1e-4
