"""The few-step flow-matching sampler of the Wan causal family (API published first).

x_t = (1 - sigma) x0 + sigma * noise; the model predicts the flow v = noise - x0, so
x0 = x_t - sigma * v. Steps on the shifted schedule (``WanConfig.step_timesteps``), fresh noise
between steps, then the commit pass at ``commit_timestep``.
"""

from __future__ import annotations

import torch

from model.wan.cache import ChunkContext
from model.wan.causal import CausalWanModel, TextKV


def generate_chunk(
    model: CausalWanModel, ctx: ChunkContext, text: TextKV, noise: torch.Tensor,
    generator: torch.Generator | None = None, timesteps: tuple[float, ...] | None = None,
) -> torch.Tensor:
    """Denoise a batch of chunks from ``noise`` (B, C, F, H, W) through every step, commit
    them into the cache, and return the clean latents x0 (B, C, F, H, W)."""
    raise NotImplementedError
