"""Where the parts of a ``--weights`` directory are, checked before anything loads.

Two layouts are read. The assembled one::

    DIR/transformer/config.json     the transformer's config (model/wan/config.py reads it)
    DIR/transformer/<checkpoint>    model.safetensors, or one authors' .pt / .pth / .safetensors
    DIR/transformer/lora.pt         LongLive's LoRA (the longlive recipe needs it)
    DIR/vae/                        config.json + diffusion_pytorch_model.safetensors,
      or DIR/Wan2.1_VAE.pth         (the authors' file, built with the Wan2.1 VAE config)
    DIR/text_encoder/               config.json + model.safetensors (or its index + shards)
    DIR/tokenizer/                  tokenizer_config.json + tokenizer.json or spiece.model

and, with a recipe (``model/wan/recipes.py``), the authors' downloads as they lie, found by
their published names: ``DIR`` is where their README's download commands ran (or the folders
themselves), e.g. for Self-Forcing::

    DIR/wan_models/Wan2.1-T2V-1.3B/   Wan-AI/Wan2.1-T2V-1.3B: config.json, Wan2.1_VAE.pth,
                                      models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/
    DIR/checkpoints/self_forcing_dmd.pt

(``Wan2.1-T2V-1.3B/`` may also be ``DIR`` itself or lie directly in it, and the checkpoint
directly in ``DIR``). The text encoder is then the authors' ``.pth``, converted as it loads
(``model/wan/convert.py``), and the transformer's config that of the Wan folder with the
recipe's settings. A missing file is a ``FileNotFoundError`` naming it, where it was looked
for, and where its authors publish it.

Matrix-Game 2.0 takes no text: instead of the text encoder and tokenizer it reads the CLIP
ViT-H/14 image encoder, ``DIR/image_encoder/`` (config.json + model.safetensors: transformers'
``CLIPVisionModel``) or else the authors' ``DIR/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``
(in their download, read as it loads: ``model/wan/clip.py``), and an optional start image
``DIR/start.png``; in the authors' download (``Skywork/Matrix-Game-2.0``) the checkpoint is the
variant's file and the config the recipe's variant when none lies beside it.

``check_layout(DIR)`` also raises ``ValueError`` naming the file, the key and the expected value
where two parts disagree (the VAE's ``z_dim`` and the transformer's ``in_dim``, the text
encoder's ``d_model`` and the transformer's ``text_dim``). It reads JSON only; the weights'
own keys and shapes are checked as they load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worldserve.model.wan import recipes
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.recipes import Published, Recipe, Served

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
LORA_FILE = "lora.pt"
# the Wan2.1-T2V-1.3B download's own names
UMT5_PTH_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
UMT5_TOKENIZER_DIR = "google/umt5-xxl"
# the Matrix-Game-2.0 (and Wan I2V) download's CLIP file: Wan's XLMRobertaCLIP state dict
CLIP_PTH_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
MATRIX_GAME_REPO = "Skywork/Matrix-Game-2.0"


@dataclass(frozen=True, slots=True)
class WanFiles:
    """Where each part of a ``--weights`` directory is."""

    config: Path | None  # the transformer's config.json; None: the recipe's architecture
    checkpoint: Path  # .safetensors or the authors' .pt
    vae: Path  # a diffusers directory or the authors' .pth
    text_encoder: Path | None  # a transformers folder or the authors' UMT5 .pth; None for Matrix-Game
    tokenizer: Path | None
    image_encoder: Path | None = None  # Matrix-Game's CLIP: a CLIPVisionModel folder or the authors' .pth
    start_image: Path | None = None  # Matrix-Game's start frame, where DIR/start.png exists
    lora: Path | None = None  # LongLive's LoRA


def find_files(root: str | Path, *, image: bool = False, recipe: Recipe | None = None) -> WanFiles:
    """The parts of ``root`` (see the module docstring); FileNotFoundError naming what is missing.
    ``image``: Matrix-Game's parts (the CLIP image encoder) instead of the text encoder's."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"--weights {root} is not a directory (wan-causal reads a directory; see docs/model-families.md)")
    if recipe is not None and not (root / TRANSFORMER_DIR).is_dir():
        return _published(root, recipe, image)
    tdir = root / TRANSFORMER_DIR
    config = tdir / CONFIG_FILE
    if not config.is_file():
        raise FileNotFoundError(f"{config} does not exist (the transformer's config)")
    lora = None
    if recipe is not None and recipe.lora is not None:
        lora = _first(recipe.lora, [tdir / LORA_FILE, tdir / recipe.lora.name, root / recipe.lora.path], recipe,
                      "LongLive's LoRA: its base alone is not the model LongLive serves")
    if (tdir / SAFETENSORS_FILE).is_file():
        checkpoint = tdir / SAFETENSORS_FILE
    else:
        pts = sorted(p for p in tdir.iterdir() if p.suffix in (".pt", ".pth", ".safetensors") and p != lora)
        if len(pts) != 1:
            found = ", ".join(p.name for p in pts) or "none"
            raise FileNotFoundError(
                f"{tdir} must hold {SAFETENSORS_FILE} or exactly one .pt/.pth/.safetensors checkpoint; found {found}"
            )
        checkpoint = pts[0]
    vae = _vae(root)
    if image:
        clip = _image_encoder(root)
        start = root / START_IMAGE_FILE
        return WanFiles(config, checkpoint, vae, None, None, clip, start if start.is_file() else None, lora)
    enc, tok = root / TEXT_ENCODER_DIR, root / TOKENIZER_DIR
    if not (enc / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{enc / CONFIG_FILE} does not exist (the UMT5 text encoder)")
    if not any((enc / f).is_file() for f in (SAFETENSORS_FILE, SAFETENSORS_FILE + ".index.json")):
        raise FileNotFoundError(f"{enc / SAFETENSORS_FILE} does not exist (the UMT5 text encoder's weights)")
    _tokenizer(tok)
    return WanFiles(config, checkpoint, vae, enc, tok, lora=lora)


def _vae(root: Path) -> Path:
    vae = root / VAE_DIR
    if not vae.is_dir():
        if (root / VAE_PTH_FILE).is_file():
            return root / VAE_PTH_FILE
        raise FileNotFoundError(f"{vae} does not exist, nor {root / VAE_PTH_FILE} (the Wan2.1 VAE)")
    for name in (CONFIG_FILE, VAE_WEIGHTS_FILE):
        if not (vae / name).is_file():
            raise FileNotFoundError(f"{vae / name} does not exist (the VAE as diffusers' AutoencoderKLWan saves it)")
    return vae


def _image_encoder(root: Path) -> Path:
    """``root/image_encoder/`` where it exists (config.json + model.safetensors), else the
    authors' CLIP file in ``root``."""
    clip = root / IMAGE_ENCODER_DIR
    if clip.is_dir():
        for name in (CONFIG_FILE, SAFETENSORS_FILE):
            if not (clip / name).is_file():
                raise FileNotFoundError(f"{clip / name} does not exist (the CLIP image encoder, transformers' "
                                        f"CLIPVisionModel)")
        return clip
    if (root / CLIP_PTH_FILE).is_file():
        return root / CLIP_PTH_FILE
    raise FileNotFoundError(
        f"{root / CLIP_PTH_FILE} does not exist, nor {clip}/ (the CLIP image encoder: the authors' file, "
        f"which {MATRIX_GAME_REPO} publishes on Hugging Face (huggingface-cli download {MATRIX_GAME_REPO} "
        f"--local-dir Matrix-Game-2.0), or a CLIPVisionModel folder)")


def _tokenizer(tok: Path) -> None:
    if not (tok / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"{tok / 'tokenizer_config.json'} does not exist (the text encoder's tokenizer)")
    if not any((tok / f).is_file() for f in ("tokenizer.json", "spiece.model")):
        raise FileNotFoundError(
            f"{tok / 'tokenizer.json'} (or spiece.model) does not exist (the tokenizer's vocabulary)")


def _first(what: Published, candidates: list[Path], recipe: Recipe, role: str = "") -> Path:
    """The first candidate that exists, else ``_missing``'s error."""
    for c in candidates:
        if c.exists():
            return c
    raise _missing(what, candidates, recipe, role)


def _missing(what: Published, candidates: list[Path], recipe: Recipe, role: str) -> FileNotFoundError:
    """An error naming the file, the places looked at and where its authors publish it."""
    looked = ", ".join(str(c) for c in dict.fromkeys(candidates))
    why = f" ({role})" if role else ""
    return FileNotFoundError(f"{what.name}{why} not found for recipe {recipe.name} (looked at {looked}); "
                             f"its authors publish it in {what.where()}")


def _published(root: Path, recipe: Recipe, image: bool) -> WanFiles:
    """The authors' downloads under ``root``, by their published names."""
    ck = recipe.checkpoint
    checkpoint = _first(ck, [root / ck.path, root / ck.name], recipe, "the distilled transformer")
    lora = None
    if recipe.lora is not None:
        places = [root / recipe.lora.path, root / recipe.lora.name, checkpoint.parent / recipe.lora.name]
        lora = _first(recipe.lora, places, recipe, "LongLive's LoRA: its base alone is not the model LongLive serves")
    config = next((c for c in (checkpoint.parent / CONFIG_FILE,) if c.is_file()), None)
    if image:
        vae = _first(Published(VAE_PTH_FILE, ck.repo, ck.command), [root / VAE_PTH_FILE], recipe, "the Wan2.1 VAE")
        if (root / IMAGE_ENCODER_DIR).is_dir():
            clip = _image_encoder(root)
        else:
            clip = _first(Published(CLIP_PTH_FILE, ck.repo, ck.command), [root / CLIP_PTH_FILE], recipe,
                          "the CLIP image encoder")
        start = root / START_IMAGE_FILE
        return WanFiles(config, checkpoint, vae, None, None, clip, start if start.is_file() else None, lora)
    bb = recipe.backbone
    assert bb is not None, recipe.name
    folders = [root / bb.path, root / bb.name, root]
    folder = next((d for d in folders if (d / VAE_PTH_FILE).is_file()), None)
    if folder is None:
        raise _missing(Published(f"{bb.path}/{VAE_PTH_FILE}", bb.repo, bb.command),
                       [d / VAE_PTH_FILE for d in folders], recipe, f"the Wan2.1 VAE, in the {bb.name} folder")

    def part(name: str, role: str) -> Path:
        return _first(Published(f"{bb.path}/{name}", bb.repo, bb.command), [folder / name], recipe, role)

    enc = part(UMT5_PTH_FILE, "the UMT5 text encoder")
    tok = part(UMT5_TOKENIZER_DIR, "the text encoder's tokenizer")
    _tokenizer(tok)
    if config is None and (folder / CONFIG_FILE).is_file():
        config = folder / CONFIG_FILE
    return WanFiles(config, checkpoint, folder / VAE_PTH_FILE, enc, tok, lora=lora)


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


def _refuse(recipe: Recipe | None) -> None:
    if recipe is not None and recipe.refused:
        raise ValueError(f"recipe {recipe.name} is not served: {recipe.refused}")


def build_config(config: Path | None, recipe: Recipe | None, default: WanConfig) -> tuple[WanConfig, Served]:
    """The transformer's config: ``default``'s architecture where no config.json is found, the
    recipe's settings, and whatever the config.json sets over them."""
    if config is None:
        if recipe is None:
            raise FileNotFoundError("no transformer config.json and no recipe to take the architecture from")
        return default.with_recipe(**recipe.config_fields()), Served(recipe)
    raw = _json(config)
    named = recipes.named_in(raw)
    over = {k: v for k, v in (recipe.config_fields() if recipe else {}).items() if k not in named}
    cfg = WanConfig.from_json(config, **over)
    overridden = tuple(k for k in sorted(named) if recipe is not None and getattr(cfg, k) != getattr(recipe, k))
    return cfg, Served(recipe, overridden)


def check_layout(root: str | Path, recipe: Recipe | None = None) -> tuple[WanFiles, WanConfig, Served]:
    """Find the parts and check that their configs agree; returns the files, the config and
    the recipe served."""
    _refuse(recipe)
    if recipe is not None and recipe.family != "wan-causal":
        raise ValueError(f"recipe {recipe.name} is served by --model {recipe.family}, not wan-causal")
    files = find_files(root, recipe=recipe)
    cfg, served = build_config(files.config, recipe, WanConfig.wan_1_3b())
    if files.vae.is_dir():
        vae = _json(files.vae / CONFIG_FILE)
        _expect(files.vae / CONFIG_FILE, "z_dim", vae.get("z_dim"), cfg.in_dim, f"in_dim of {files.config}")
    assert files.text_encoder is not None
    if files.text_encoder.is_dir():
        enc = _json(files.text_encoder / CONFIG_FILE)
        _expect(files.text_encoder / CONFIG_FILE, "d_model", enc.get("d_model"), cfg.text_dim,
                f"text_dim of {files.config}")
    return files, cfg, served


def image_recipe(config: Path | None, recipe: Recipe | None) -> Recipe:
    """Matrix-Game's recipe: the one named, else the variant its config.json's action_config says."""
    if recipe is not None:
        if recipe.family != "matrix-game-2":
            raise ValueError(f"recipe {recipe.name} is served by --model {recipe.family}, not matrix-game-2")
        return recipe
    if config is None:
        return recipes.get("matrix-game-2")
    a = _json(config).get("action_config") or {}
    key = (int(a.get("keyboard_dim_in", 4)), bool(a.get("enable_mouse", True)))
    return recipes.get(recipes.MATRIX_GAME_BY_ACTIONS.get(key, "matrix-game-2"))


def check_image_layout(root: str | Path, recipe: Recipe | None = None) -> tuple[WanFiles, WanConfig, Served]:
    """Matrix-Game's parts and configs: the transformer's config must be i2v with an
    action_config, its recipe is the variant's (the authors' inference yaml) where the file
    names none of its fields, and the CLIP encoder's width is its image_dim."""
    files = find_files(root, image=True, recipe=recipe)
    recipe = image_recipe(files.config, recipe)
    _refuse(recipe)
    assert recipe.variant is not None
    cfg, served = build_config(files.config, recipe, WanConfig.matrix_game_2(recipe.variant))
    if cfg.model_type != "i2v" or cfg.action_config is None:
        actions = "set" if cfg.action_config else "absent"
        raise ValueError(f"{files.config}: model_type is {cfg.model_type!r} with action_config {actions}; "
                         "Matrix-Game's config is i2v with an action_config")
    if files.vae.is_dir():
        vae = _json(files.vae / CONFIG_FILE)
        _expect(files.vae / CONFIG_FILE, "z_dim", vae.get("z_dim"), cfg.out_dim, f"out_dim of {files.config}")
    assert files.image_encoder is not None
    if files.image_encoder.is_dir():  # the authors' .pth: its width is checked as it loads
        clip = _json(files.image_encoder / CONFIG_FILE)
        width = clip.get("hidden_size", (clip.get("vision_config") or {}).get("hidden_size"))
        _expect(files.image_encoder / CONFIG_FILE, "hidden_size", width, cfg.image_dim,
                f"image_dim of {files.config or 'recipe ' + recipe.name}")
    return files, cfg, served
