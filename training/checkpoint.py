"""Training checkpoints (``training/train.py``): model, EMA and optimizer state in one
safetensors file (no pickle) beside a JSON of the run's bookkeeping, and the critic's, when
there is one, under its own prefixes; ``export_checkpoint`` writes the EMA weights as
servable weights.

    out/ckpt.safetensors   model.<name>  ema.<name>  opt.<param>.<state>
                           critic.<name>  copt.<param>.<state>   (with ``--adv-weight``)
    out/ckpt.json          step, CPU and wall seconds, history, the model config
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel
from worldserve.model.default.weights import load_state, save_model
from worldserve.training import atomic
from worldserve.training.critic import Adversary
from worldserve.training.optim_state import load_optimizer_tensors, optimizer_tensors
from worldserve.training.targets import fit_shift_head

# may be missing from older checkpoints: they start from their initial values
NEW_MODULES = ("motion_prior.", "anchor_stems.", "anchor_heads.", "shift_head.", "state_stems.", "state_heads.",
               "state_basis")


def save_checkpoint(out: Path, model: WorldModel, ema: WorldModel, opt: torch.optim.Optimizer,
                    meta: dict, adversary: Adversary | None = None) -> None:
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors.update({f"ema.{k}": v for k, v in ema.state_dict().items()})
    tensors.update(optimizer_tensors(opt, model, "opt."))
    if adversary is not None:
        tensors.update(adversary.state())
    tmp = out / "ckpt.tmp.safetensors"
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, out / "ckpt.safetensors")
    atomic.write_text(out / "ckpt.json", json.dumps(meta, indent=2))


def load_checkpoint(out: Path, model: WorldModel, ema: WorldModel, opt: torch.optim.Optimizer,
                    adversary: Adversary | None = None) -> dict:
    """Restore the checkpoint in ``out``; returns its bookkeeping. A critic the checkpoint
    does not hold starts fresh."""
    tensors = load_file(str(out / "ckpt.safetensors"))
    part = lambda pre: {k[len(pre):]: v for k, v in tensors.items() if k.startswith(pre)}  # noqa: E731
    load_state(model, part("model."), "checkpoint model", allow_missing=NEW_MODULES)
    load_state(ema, part("ema."), "checkpoint ema", allow_missing=NEW_MODULES)
    load_optimizer_tensors(opt, model, tensors, "opt.")
    if adversary is not None and adversary.load(tensors):
        print("resumed the critic", file=sys.stderr)
    return json.loads((out / "ckpt.json").read_text())


def init_from_weights(model: WorldModel, ema: WorldModel, weights: Path) -> int:
    """Start ``model`` and ``ema`` from servable weights (``save_model``'s file, e.g. the
    committed default): a fine-tune where the training checkpoint is not at hand. Returns
    the step count the weights record (0 where they record none)."""
    path = weights.with_suffix(".safetensors")
    state = load_file(str(path))
    for m, name in ((model, "model"), (ema, "ema")):
        load_state(m, state, f"{path} ({name})", allow_missing=NEW_MODULES)
    with safe_open(str(path), "pt") as f:
        return int((f.metadata() or {}).get("steps", 0))


def export_checkpoint(out: Path, dest: Path, sampler: dict[str, Any] | None = None) -> Path:
    """Write the EMA weights of the checkpoint in ``out`` as servable weights at ``dest``,
    with the sampler settings in ``sampler`` (``ModelConfig.with_sampler``) in their config."""
    meta = json.loads((out / "ckpt.json").read_text())
    cfg_overrides = meta.get("model")
    tensors = load_file(str(out / "ckpt.safetensors"))
    ema_state = {k[4:]: v for k, v in tensors.items() if k.startswith("ema.")}
    cfg = (ModelConfig.from_dict(cfg_overrides) if cfg_overrides else ModelConfig()).with_sampler(sampler)
    model = WorldModel(cfg)
    load_state(model, ema_state, f"{out} ema", allow_missing=NEW_MODULES)
    fit_shift_head(model)  # the shift per action in closed form (its EMA lags the training term)
    return save_model(model, dest, metadata={"steps": str(meta["step"])})
