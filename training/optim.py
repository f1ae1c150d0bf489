"""What trains and how fast: the optimizer's parameter groups, the learning-rate schedule,
a frozen part held at the served weights, and the adversarial term's ramp
(``training/train.py``'s loop uses them)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch

from worldserve.model.default.net.dit import WorldModel

if TYPE_CHECKING:
    from worldserve.training.train import TrainConfig


def lr_at(step: int, tc: TrainConfig, total: int, start: int = 0) -> float:
    """Linear warm-up then cosine to 0.1 x, over steps ``start`` .. ``total``."""
    step -= start
    total -= start
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = min(1.0, (step - tc.warmup) / max(1, total - tc.warmup))
    return tc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: WorldModel, tc: TrainConfig, fresh: frozenset[str] = frozenset()) -> torch.optim.AdamW:
    """AdamW, no decay on biases and norms; each group's ``scale`` multiplies the scheduled
    learning rate: ``new_module_lr_scale`` for the ``fresh`` parameters (names the checkpoint
    being resumed lacks: a head added to trained weights has to travel far while the rest
    only adjusts), 1 elsewhere."""
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():  # (fresh, decayed)
        if not p.requires_grad:
            continue
        groups.setdefault((name in fresh, p.dim() >= 2), []).append(p)
    return torch.optim.AdamW(
        [{"params": ps, "weight_decay": tc.weight_decay if decayed else 0.0,
          "scale": tc.new_module_lr_scale if new else 1.0}
         for (new, decayed), ps in sorted(groups.items())],
        lr=tc.lr, betas=(0.9, 0.98),
    )


def freeze_except(model: WorldModel, prefixes: tuple[str, ...]) -> None:
    """Train only the parameters named by ``prefixes``. A frozen part builds no graph, so a
    step costs its forward and the trained part's backward."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(prefixes))
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"train_only {list(prefixes)} names no parameter of the model")


def hold_at_ema(model: WorldModel, ema: WorldModel) -> None:
    """Frozen parameters take their EMA values, the weights that are served, so the trained
    part learns on top of those and the EMA of the frozen part stays where it is."""
    ema_state = dict(ema.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                p.copy_(ema_state[name])


class _Warmup(Protocol):
    adv_warmup: int


def adv_ramp(run_step: int, tc: _Warmup) -> float:
    """The adversarial term's share at this run's ``run_step``: 0 while a fresh critic learns
    what the frames look like (``adv_warmup`` steps), then linear to 1 over as many."""
    if tc.adv_warmup <= 0:
        return 1.0
    return min(1.0, max(0.0, (run_step - tc.adv_warmup) / tc.adv_warmup))
