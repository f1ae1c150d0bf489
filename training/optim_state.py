"""Optimizer state as flat, named tensors, for safetensors checkpoints (no pickle): the
model's (``training/checkpoint.py``) and the critic's (``training/critic.py``)."""

from __future__ import annotations

import torch


def optimizer_tensors(opt: torch.optim.Optimizer, module: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """``opt``'s per-parameter state as flat tensors ``<prefix><param name>.<state key>``
    (0-d values, such as Adam's step, as 1-element tensors)."""
    names = {id(p): k for k, p in module.named_parameters()}
    out = {}
    for p, st in opt.state.items():
        for key, val in st.items():
            if torch.is_tensor(val):
                out[f"{prefix}{names[id(p)]}.{key}"] = val.reshape(-1) if val.dim() == 0 else val
    return out


def load_optimizer_tensors(opt: torch.optim.Optimizer, module: torch.nn.Module, tensors: dict[str, torch.Tensor],
                           prefix: str) -> None:
    """The inverse of ``optimizer_tensors``; state of parameters ``module`` no longer has is
    skipped."""
    params = dict(module.named_parameters())
    for key, val in tensors.items():
        if not key.startswith(prefix):
            continue
        pname, skey = key[len(prefix):].rsplit(".", 1)
        if pname not in params:
            continue
        p = params[pname]
        # the step count stays a host scalar (Adam's default); moments live with the weights
        opt.state[p][skey] = val.reshape(()) if skey == "step" else val.to(p.device)
