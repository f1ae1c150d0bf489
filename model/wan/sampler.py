"""The few-step flow-matching sampler of the Wan causal family.

Flow matching on a straight path: x_t = (1 - sigma) x0 + sigma * noise, with sigma the
timestep over ``num_train_timesteps``. The model predicts the flow v = noise - x0, so
x0 = x_t - sigma * v. The steps are the recipe's timesteps (1000, 750, 500, 250) moved onto the
shifted schedule, sigma' = shift*s / (1 + (shift - 1)*s) with shift 5 (Self-Forcing's
``warp_denoising_step``: model timesteps 1000, 937.5, 833.3, 625). Between steps the x0 guess
is noised again with fresh noise to the next step's sigma; after the last step the clean guess
goes through the commit pass (timestep 0), which writes the chunk's keys and values.
"""

from __future__ import annotations

import torch

from worldserve.model.wan.action import ActionContext
from worldserve.model.wan.cache import WanChunkContext
from worldserve.model.wan.causal import CausalWanModel, TextKV


def to_x0(x_t: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """Clean sample from a noisy one and the predicted flow: x0 = x_t - sigma * v."""
    return x_t - sigma * v


def add_noise(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """The point at noise level sigma on the straight path from x0 to noise."""
    return (1 - sigma) * x0 + sigma * noise


def sigma_of(model: CausalWanModel, t: torch.Tensor) -> torch.Tensor:
    """Per-frame sigma (B, F) of model timesteps, shaped to broadcast over (B, C, F, H, W)."""
    return (t / model.cfg.num_train_timesteps)[:, None, :, None, None]


@torch.no_grad()
def generate_chunk(
    model: CausalWanModel, ctx: WanChunkContext, text: TextKV, noise: torch.Tensor,
    generator: torch.Generator | None = None, timesteps: tuple[float, ...] | None = None,
    cond: torch.Tensor | None = None, act: ActionContext | None = None,
) -> torch.Tensor:
    """Denoise a batch of chunks from ``noise`` (B, C, F, H, W) through every step, commit
    them into the cache, and return the clean latents x0 (B, C, F, H, W) float32.

    ``timesteps``: model timesteps to use instead of the config's warped steps (a degraded
    session runs fewer). Fresh noise between steps comes from ``generator``. Matrix-Game's
    image condition ``cond`` and actions ``act`` go to every step and the commit."""
    steps = model.cfg.step_timesteps if timesteps is None else timesteps
    b, f = noise.shape[0], noise.shape[2]
    x = noise.float()
    x0 = x
    for i, step in enumerate(steps):
        t = torch.full((b, f), float(step), device=noise.device)
        v = model.denoise(x, t, text, ctx, cond, act)
        x0 = to_x0(x, v, sigma_of(model, t))
        if i + 1 < len(steps):
            t_next = torch.full((b, f), float(steps[i + 1]), device=noise.device)
            fresh = torch.randn(x.shape, generator=generator, device=noise.device, dtype=x.dtype)
            x = add_noise(x0, fresh, sigma_of(model, t_next))
    model.commit(x0, text, ctx, cond, act)
    return x0
