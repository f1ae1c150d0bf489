"""A tiny random Wan causal transformer and its files, in the layout the authors publish.

``tiny_config()`` is ``WanConfig.tiny`` (width 48, 2 heads, 2 layers, 4 latent channels,
text width 24, 8 text tokens, chunks of 2 frames, 1 sink, a window of 4). ``random_model``
fills every weight with noise (the authors' init zeroes the head, which would make checks pass
trivially). ``save_checkpoint`` writes a ``.pt`` as Self-Forcing does (``generator_ema`` and
``generator`` state dicts, keys under ``model.``); ``write_config`` writes a Wan ``config.json``.
``build_tiny_checkpoint(root)`` does all three and returns the paths: end-to-end tests use it
to fill a ``--weights`` directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from worldserve.model.wan.causal import CausalWanModel
from worldserve.model.wan.config import WanConfig

LATENT_HEIGHT, LATENT_WIDTH = 4, 6  # a tiny latent frame: 2 x 3 tokens


def tiny_config(**kw: Any) -> WanConfig:
    return WanConfig.tiny(**kw)


def random_model(cfg: WanConfig | None = None, seed: int = 0, std: float = 0.2) -> CausalWanModel:
    """A model whose every weight is random; norm weights are 1 + noise."""
    cfg = cfg or tiny_config()
    torch.manual_seed(seed)
    model = CausalWanModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + std * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    return model.eval()


def save_checkpoint(
    state: CausalWanModel | dict[str, torch.Tensor], path: str | Path,
    keys: tuple[str, ...] = ("generator", "generator_ema"), prefix: str = "model.",
) -> Path:
    """Save a state dict as the authors' training code does: ``{key: {prefix + name: tensor}}``
    for each of ``keys`` (an empty ``keys`` saves the bare state dict)."""
    sd = state.state_dict() if isinstance(state, torch.nn.Module) else state
    sd = {prefix + k: v.detach().clone() for k, v in sd.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: sd for k in keys} if keys else sd, path)
    return path


def write_config(cfg: WanConfig, path: str | Path) -> Path:
    """A Wan ``config.json``: the transformer under the authors' names plus the recipe fields."""
    raw: dict[str, Any] = {"_class_name": "WanModel", "_diffusers_version": "0.30.0"}
    for k, v in cfg.to_dict().items():
        raw[k] = list(v) if isinstance(v, tuple) else v
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=2) + "\n")
    return path


def build_tiny_checkpoint(
    root: str | Path, cfg: WanConfig | None = None, seed: int = 0, name: str = "model.pt",
) -> tuple[Path, Path, CausalWanModel]:
    """Write ``root/config.json`` and ``root/<name>`` for a random tiny model; return
    (config path, checkpoint path, the model)."""
    cfg = cfg or tiny_config()
    model = random_model(cfg, seed)
    root = Path(root)
    return write_config(cfg, root / "config.json"), save_checkpoint(model, root / name), model
