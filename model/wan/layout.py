"""The ``--weights DIR`` layout of the Wan causal family, checked before anything loads.

::

    DIR/transformer/config.json     the transformer's config (model/wan/config.py reads it)
    DIR/transformer/<checkpoint>    model.safetensors, or one authors' .pt / .pth
    DIR/vae/                        config.json + diffusion_pytorch_model.safetensors,
      or DIR/Wan2.1_VAE.pth         (the authors' file, built with the Wan2.1 VAE config)
    DIR/text_encoder/               config.json + model.safetensors (or its index + shards)
    DIR/tokenizer/                  tokenizer_config.json + tokenizer.json or spiece.model

Matrix-Game 2.0 (``--model matrix-game-2``) takes no text: instead of the text encoder and
tokenizer it reads ``DIR/image_encoder/`` (config.json + model.safetensors: transformers'
``CLIPVisionModel``, CLIP ViT-H/14) and an optional start image ``DIR/start.png``.

``check_layout(DIR)`` raises ``FileNotFoundError`` naming the first missing file and
``ValueError`` naming the file, the key and the expected value where two parts disagree
(the VAE's ``z_dim`` and the transformer's ``in_dim``, the text encoder's ``d_model`` and
the transformer's ``text_dim``). It reads JSON only; the weights' own keys and shapes are
checked as they load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worldserve.model.wan.config import WanConfig

TRANSFORMER_DIR = "transformer"
CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
VAE_DIR = "vae"
VAE_PTH_FILE = "Wan2.1_VAE.pth"
VAE_WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
TEXT_ENCODER_DIR = "text_encoder"
TOKENIZER_DIR = "tokenizer"
IMAGE_ENCODER_DIR = "image_encoder"
START_IMAGE_FILE = "start.png"


@dataclass(frozen=True, slots=True)
class WanFiles:
    """Where each part of a ``--weights`` directory is."""

    config: Path  # the transformer's config.json
    checkpoint: Path  # .safetensors or the authors' .pt
    vae: Path  # a diffusers directory or the authors' .pth
    text_encoder: Path | None  # None for Matrix-Game
    tokenizer: Path | None
    image_encoder: Path | None = None  # Matrix-Game's CLIP vision model
    start_image: Path | None = None  # Matrix-Game's start frame, where DIR/start.png exists


def find_files(root: str | Path, *, image: bool = False) -> WanFiles:
    """The parts of ``root`` (see the module docstring); FileNotFoundError naming what is missing.
    ``image``: Matrix-Game's parts (the CLIP image encoder) instead of the text encoder's."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--weights {root} is not a directory (wan-causal reads a directory; see docs/models.md)")
    tdir = root / TRANSFORMER_DIR
    config = tdir / CONFIG_FILE
    if not config.is_file():
        raise FileNotFoundError(f"{config} does not exist (the transformer's config)")
    if (tdir / SAFETENSORS_FILE).is_file():
        checkpoint = tdir / SAFETENSORS_FILE
    else:
        pts = sorted(p for p in tdir.iterdir() if p.suffix in (".pt", ".pth", ".safetensors"))
        if len(pts) != 1:
            found = ", ".join(p.name for p in pts) or "none"
            raise FileNotFoundError(
                f"{tdir} must hold {SAFETENSORS_FILE} or exactly one .pt/.pth/.safetensors checkpoint; found {found}"
            )
        checkpoint = pts[0]
    vae = root / VAE_DIR
    if not vae.is_dir():
        if (root / VAE_PTH_FILE).is_file():
            vae = root / VAE_PTH_FILE
        else:
            raise FileNotFoundError(f"{vae} does not exist, nor {root / VAE_PTH_FILE} (the Wan2.1 VAE)")
    else:
        for name in (CONFIG_FILE, VAE_WEIGHTS_FILE):
            if not (vae / name).is_file():
                raise FileNotFoundError(f"{vae / name} does not exist (the VAE as diffusers' AutoencoderKLWan saves it)")
    if image:
        clip = root / IMAGE_ENCODER_DIR
        for name in (CONFIG_FILE, SAFETENSORS_FILE):
            if not (clip / name).is_file():
                raise FileNotFoundError(f"{clip / name} does not exist (the CLIP image encoder, transformers' CLIPVisionModel)")
        start = root / START_IMAGE_FILE
        return WanFiles(config, checkpoint, vae, None, None, clip, start if start.is_file() else None)
    enc, tok = root / TEXT_ENCODER_DIR, root / TOKENIZER_DIR
    if not (enc / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{enc / CONFIG_FILE} does not exist (the UMT5 text encoder)")
    if not any((enc / f).is_file() for f in (SAFETENSORS_FILE, SAFETENSORS_FILE + ".index.json")):
        raise FileNotFoundError(f"{enc / SAFETENSORS_FILE} does not exist (the UMT5 text encoder's weights)")
    if not (tok / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"{tok / 'tokenizer_config.json'} does not exist (the text encoder's tokenizer)")
    if not any((tok / f).is_file() for f in ("tokenizer.json", "spiece.model")):
        raise FileNotFoundError(f"{tok / 'tokenizer.json'} (or spiece.model) does not exist (the tokenizer's vocabulary)")
    return WanFiles(config, checkpoint, vae, enc, tok)


def _json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds a {type(raw).__name__}, not an object")
    return raw


def _expect(path: Path, key: str, got: object, want: object, why: str) -> None:
    if got != want:
        raise ValueError(f"{path}: {key} is {got!r}, expected {want!r} ({why})")


def check_layout(root: str | Path) -> tuple[WanFiles, WanConfig]:
    """Find the parts and check that their configs agree; returns the files and the config."""
    files = find_files(root)
    cfg = WanConfig.from_json(files.config)
    if files.vae.is_dir():
        vae = _json(files.vae / CONFIG_FILE)
        _expect(files.vae / CONFIG_FILE, "z_dim", vae.get("z_dim"), cfg.in_dim, f"in_dim of {files.config}")
    assert files.text_encoder is not None
    enc = _json(files.text_encoder / CONFIG_FILE)
    _expect(files.text_encoder / CONFIG_FILE, "d_model", enc.get("d_model"), cfg.text_dim,
            f"text_dim of {files.config}")
    return files, cfg


def check_image_layout(root: str | Path, **recipe: object) -> tuple[WanFiles, WanConfig]:
    """Matrix-Game's parts and configs: the transformer's config must be i2v with an
    action_config, its recipe defaults to the authors' inference settings (``recipe``, from
    the caller) where the file names none, and the CLIP encoder's width is its image_dim."""
    files = find_files(root, image=True)
    raw = _json(files.config)
    named = set(raw) | {ours for theirs, ours in _RECIPE_ALIASES.items() if theirs in raw}
    cfg = WanConfig.from_json(files.config, **{k: v for k, v in recipe.items() if k not in named})
    if cfg.model_type != "i2v" or cfg.action_config is None:
        raise ValueError(f"{files.config}: model_type is {cfg.model_type!r} with action_config "
                         f"{'set' if cfg.action_config else 'absent'}; Matrix-Game's config is i2v with an action_config")
    if files.vae.is_dir():
        vae = _json(files.vae / CONFIG_FILE)
        _expect(files.vae / CONFIG_FILE, "z_dim", vae.get("z_dim"), cfg.out_dim, f"out_dim of {files.config}")
    assert files.image_encoder is not None
    clip = _json(files.image_encoder / CONFIG_FILE)
    width = clip.get("hidden_size", (clip.get("vision_config") or {}).get("hidden_size"))
    _expect(files.image_encoder / CONFIG_FILE, "hidden_size", width, cfg.image_dim, f"image_dim of {files.config}")
    return files, cfg


# recipe fields the authors' files name otherwise (the house's names are the dataclass's)
_RECIPE_ALIASES = {"denoising_step_list": "timesteps", "num_frame_per_block": "chunk_frames",
                   "sink_size": "sink_frames", "local_attn_size": "window_frames",
                   "warp_denoising_step": "warp_timesteps", "timestep_shift": "shift"}
