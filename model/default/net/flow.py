"""The flow the sampler walks: a clean frame at a noise level, and the sampler's next input.

On the flow-matching path a frame at level t is ``(1 - t) * x + t * noise``; the model
predicts the clean frame, and each step of the few-step sampler noises its guess again
down to the next level (``next_noisy``). Serving (``WorldModel.sample_chunk``), its CUDA
graphs and training's self-rollout all step through these, so they cannot drift apart.
"""

from __future__ import annotations

import torch

_LEVELS: dict[tuple[tuple[float, ...], torch.device], torch.Tensor] = {}


def noised(x: torch.Tensor, level: float | torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``x`` at noise ``level`` of the flow (a float, or a tensor that broadcasts over ``x``)."""
    return (1 - level) * x + level * noise


def next_noisy(
    x: torch.Tensor, x0: torch.Tensor, t: float, nxt: float, fresh: torch.Tensor, eta: float,
) -> torch.Tensor:
    """The sampler's input at level ``nxt`` from the step at ``t`` (input ``x``, guess ``x0``):
    the guess noised again, with noise that is ``eta`` fresh (``fresh``) and the rest the noise
    ``x`` holds by the guess. eta 1 is the few-step sampler that every schedule trains (and
    training's self-rollout runs); eta 0 is the deterministic Euler step of the flow, what the
    shipped weights serve with (``ModelConfig.sampler_eta``)."""
    noise = fresh if eta == 1.0 else (1 - eta * eta) ** 0.5 * (x - (1 - t) * x0) / t + eta * fresh
    return (1 - nxt) * x0 + nxt * noise


def level_tensor(levels: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """The noise levels as a tensor on ``device``, made once: no host-to-device copy per
    chunk, which is also what lets a CUDA graph capture ``prepare_chunk``."""
    key = (levels, device)
    if key not in _LEVELS:
        with torch.inference_mode(False):  # a normal tensor: training reads it too
            _LEVELS[key] = torch.tensor(levels, device=device)
    return _LEVELS[key]
