"""A whole tiny ``--weights`` directory for ``--model matrix-game-2`` (model/wan/layout.py,
``check_image_layout``): a random tiny Matrix-Game transformer saved as its authors save theirs
(safetensors of the generator wrapper, keys under ``model.``) with an authors'-style
config.json (model_type i2v, action_config, local_attn_size; the recipe left to the defaults),
the tiny random Wan2.1 VAE of tests/model/wan/tiny_dir.py and a tiny random CLIPVisionModel.
Frames are 32x48 (latents 4x6): bucket 32."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.model.wan.tiny import random_model
from tests.model.wan.tiny_dir import HEIGHT, TINY_VAE, WIDTH
from worldserve.model.wan.config import WanConfig

__all__ = ["HEIGHT", "WIDTH", "build_tiny_mg_dir", "tiny_mg_config"]


def tiny_mg_config() -> WanConfig:
    return WanConfig.tiny_matrix_game()


def build_tiny_mg_dir(root: str | Path, seed: int = 0) -> Path:
    from diffusers import AutoencoderKLWan
    from transformers import CLIPVisionConfig, CLIPVisionModel

    root = Path(root)
    cfg = tiny_mg_config()
    model = random_model(cfg, seed)
    tdir = root / "transformer"
    tdir.mkdir(parents=True, exist_ok=True)
    tensors = {"model." + k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(tdir / "base_distill.safetensors"))
    raw = {
        "_class_name": "CausalWanModel", "_diffusers_version": "0.35.0.dev0",
        "action_config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg.action_config).items()},
        "dim": cfg.dim, "eps": cfg.eps, "ffn_dim": cfg.ffn_dim, "freq_dim": cfg.freq_dim, "in_dim": cfg.in_dim,
        "local_attn_size": cfg.window_frames + cfg.chunk_frames, "model_type": "i2v", "num_heads": cfg.num_heads,
        "num_layers": cfg.num_layers, "out_dim": cfg.out_dim, "sink_size": 0, "text_len": cfg.text_len,
        "image_dim": cfg.image_dim, "num_frame_per_block": cfg.chunk_frames,
    }
    (tdir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(**TINY_VAE)
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(0.05 * torch.randn_like(p))
    vae.save_pretrained(root / "vae")
    torch.manual_seed(seed + 2)
    clip = CLIPVisionModel(CLIPVisionConfig(
        hidden_size=cfg.image_dim, intermediate_size=2 * cfg.image_dim, num_hidden_layers=2, num_attention_heads=2,
        image_size=28, patch_size=14,
    ))
    clip.save_pretrained(root / "image_encoder")
    return root
