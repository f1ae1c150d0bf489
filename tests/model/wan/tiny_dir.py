"""A whole tiny ``--weights`` directory for ``--model wan-causal`` (model/wan/layout.py):
the authors' ``.pt`` and config.json of a random tiny transformer (tests/model/wan/tiny.py),
a random tiny Wan2.1 VAE saved as diffusers saves it, and a tiny UMT5 encoder with its
tokenizer (tests/model/wan/tiny_text.py). Frames are 32x48 (latents 4x6): bucket 32."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tests.model.wan.tiny import LATENT_HEIGHT, LATENT_WIDTH, build_tiny_checkpoint, tiny_config
from tests.model.wan.tiny_text import build_tiny_text_dirs

if TYPE_CHECKING:
    from worldserve.model.wan.runner import WanRunner

# The Wan2.1 VAE's layout (4 stages, 2 res blocks, time upsampling in the last two) at base width 4.
TINY_VAE = {
    "base_dim": 4,
    "z_dim": 4,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "temperal_downsample": [False, True, True],
    "latents_mean": [0.3, -0.5, 0.1, 0.8],
    "latents_std": [1.5, 0.7, 2.0, 1.2],
}
HEIGHT, WIDTH = 8 * LATENT_HEIGHT, 8 * LATENT_WIDTH  # 32 x 48 pixels
SIZE = f"{HEIGHT}x{WIDTH}"


def load_tiny(model: str, weights: Path, **options: Any) -> WanRunner:
    """``--model MODEL --weights WEIGHTS`` through the registry (model/registry.py), as the server
    loads it, at the tiny frame size in float32; ``options``: other ``LoadOptions`` fields."""
    from worldserve.model.registry import LoadOptions, load
    from worldserve.model.wan.runner import WanRunner

    runner = load(model, LoadOptions(**{"weights": weights, "dtype": "float32", "sizes": ((HEIGHT, WIDTH),),
                                        **options}))
    assert isinstance(runner, WanRunner)
    return runner


def build_tiny_wan_dir(root: str | Path, seed: int = 0) -> Path:
    """Fill ``root`` with the four parts; returns it."""
    from diffusers import AutoencoderKLWan

    root = Path(root)
    cfg = tiny_config()
    build_tiny_checkpoint(root / "transformer", cfg, seed=seed, name="model.pt")
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(**TINY_VAE)
    with torch.no_grad():  # a random decoder that draws something (not a flat grey)
        for p in vae.parameters():
            p.add_(0.05 * torch.randn_like(p))
    vae.save_pretrained(root / "vae")
    build_tiny_text_dirs(root, d_model=cfg.text_dim, heads=2, seed=seed + 2)
    return root
