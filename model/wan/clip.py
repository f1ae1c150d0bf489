"""The CLIP image tokens Matrix-Game 2.0's cross-attention reads: CLIP ViT-H/14 through
``transformers``' ``CLIPVisionModel``, as Wan's image-to-video models use it.

Wan's CLIP (``encode_video`` of the authors' wrapper) resizes the whole frame to the model's
224 x 224 (bicubic, no crop), normalises with CLIP's mean and std, and returns the tokens
after the penultimate transformer layer: 257 tokens (the class token and 16 x 16 patches) of
width 1280. In transformers' terms that is ``hidden_states[-2]``; the same weights ship as the
``image_encoder`` folder of Wan-AI/Wan2.1-I2V-14B-480P-Diffusers. The model is built from local
files only.

The authors' own file (``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``, in every
Matrix-Game-2.0 and Wan I2V download) is read too: it is the state dict of Wan's
``XLMRobertaCLIP`` (open-clip's xlm-roberta-large ViT-H-14 under Wan's module names), of which
the vision tower (``visual.*``) is renamed to transformers' ``CLIPVisionModel`` as it loads
(``load_authors_clip``), or once by ``worldserve convert`` (``convert_clip``). Per block,
``norm1`` / ``norm2`` are ``layer_norm1`` / ``layer_norm2``, ``attn.to_qkv`` (q, k and v stacked
on the output axis) splits into ``q_proj`` / ``k_proj`` / ``v_proj``, ``attn.proj`` is
``out_proj``, ``mlp.0`` / ``mlp.2`` are ``fc1`` / ``fc2``; the class and position embeddings
lose their leading unit axes. Both compute the same thing: pre-norm blocks with exact GELU,
LayerNorm eps 1e-5, softmax attention scaled by the head width's inverse square root, and a
patch convolution without bias. The text tower (``textual.*``), the logit scale and the
vision head are not used by the image condition and are dropped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

CLIP_HEADS = 16  # the authors' clip_xlm_roberta_vit_h_14: vision_heads (not readable from the shapes)
CLIP_EPS = 1e-5

_BLOCK = {
    "norm1.weight": "layer_norm1.weight", "norm1.bias": "layer_norm1.bias",
    "norm2.weight": "layer_norm2.weight", "norm2.bias": "layer_norm2.bias",
    "attn.proj.weight": "self_attn.out_proj.weight", "attn.proj.bias": "self_attn.out_proj.bias",
    "mlp.0.weight": "mlp.fc1.weight", "mlp.0.bias": "mlp.fc1.bias",
    "mlp.2.weight": "mlp.fc2.weight", "mlp.2.bias": "mlp.fc2.bias",
}
_TOP = {
    "visual.patch_embedding.weight": "embeddings.patch_embedding.weight",
    "visual.pre_norm.weight": "pre_layrnorm.weight", "visual.pre_norm.bias": "pre_layrnorm.bias",
    "visual.post_norm.weight": "post_layernorm.weight", "visual.post_norm.bias": "post_layernorm.bias",
}
_DROPPED = ("visual.head", "textual.", "log_scale")
_BLOCK_KEY = re.compile(r"visual\.transformer\.(\d+)\.(.+)")


def clip_state(authors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The vision tower of the authors' CLIP state dict under ``CLIPVisionModel``'s names
    (relative to its ``vision_model``); ValueError naming a key it does not know."""
    out: dict[str, torch.Tensor] = {}
    for k, v in authors.items():
        if k.startswith(_DROPPED):
            continue
        if k in _TOP:
            out[_TOP[k]] = v
        elif k == "visual.cls_embedding":  # (1, 1, dim)
            out["embeddings.class_embedding"] = v.reshape(-1)
        elif k == "visual.pos_embedding":  # (1, tokens, dim)
            out["embeddings.position_embedding.weight"] = v.reshape(v.shape[-2], v.shape[-1])
        elif (m := _BLOCK_KEY.fullmatch(k)) is not None:
            layer, rest = f"encoder.layers.{m.group(1)}.", m.group(2)
            if rest in ("attn.to_qkv.weight", "attn.to_qkv.bias"):
                kind = rest.rsplit(".", 1)[1]
                for name, part in zip(("q", "k", "v"), v.chunk(3, dim=0), strict=True):
                    out[f"{layer}self_attn.{name}_proj.{kind}"] = part
            elif rest in _BLOCK:
                out[layer + _BLOCK[rest]] = v
            else:
                raise ValueError(f"unknown key {k!r} in the authors' CLIP state dict")
        else:
            raise ValueError(f"unknown key {k!r} in the authors' CLIP state dict")
    return out


def clip_config(authors: dict[str, torch.Tensor], heads: int = CLIP_HEADS) -> dict[str, Any]:
    """The CLIPVisionConfig fields of the authors' CLIP state dict, read from its shapes."""
    width, _, patch, _ = authors["visual.patch_embedding.weight"].shape
    tokens = authors["visual.pos_embedding"].shape[-2]
    grid = round((tokens - 1) ** 0.5)
    if grid * grid != tokens - 1:
        raise ValueError(f"the authors' CLIP has {tokens} position embeddings: not a class token and a square grid")
    layers = 1 + max(int(m.group(1)) for k in authors if (m := _BLOCK_KEY.fullmatch(k)))
    return dict(hidden_size=int(width), intermediate_size=int(authors["visual.transformer.0.mlp.0.weight"].shape[0]),
                num_hidden_layers=layers, num_attention_heads=heads, image_size=int(grid * patch),
                patch_size=int(patch), num_channels=3, hidden_act="gelu", layer_norm_eps=CLIP_EPS)


def read_authors_clip(path: str | Path) -> dict[str, torch.Tensor]:
    """The authors' CLIP file (Wan's XLMRobertaCLIP state dict), memory-mapped."""
    from worldserve.model.wan.weights import read_authors_file

    return read_authors_file(path, "CLIP image encoder", "visual.patch_embedding.weight")


def load_authors_clip(path: str | Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
    """transformers' ``CLIPVisionModel`` with the vision tower of the authors' ``.pth``, in eval mode."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    authors = read_authors_clip(path)
    with torch.device("meta"):
        model = CLIPVisionModel(CLIPVisionConfig(**clip_config(authors)))
    names = set(model.state_dict())
    prefix = "vision_model." if any(k.startswith("vision_model.") for k in names) else ""
    state = {prefix + k: v.to(dtype) for k, v in clip_state(authors).items()}
    missing, unexpected = names - set(state), set(state) - names
    if missing or unexpected:
        raise ValueError(f"{path}: the CLIP vision tower does not match CLIPVisionModel: missing "
                         f"{sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")
    model.load_state_dict(state, strict=True, assign=True)
    for module in model.modules():  # non-persistent buffers (the position ids) are still on the meta device
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                if name != "position_ids":
                    raise ValueError(f"CLIPVisionModel has a buffer {name!r} this loader does not fill")
                module.register_buffer(name, torch.arange(buf.shape[-1]).expand(buf.shape), persistent=False)
    return model.to(device).eval()


def convert_clip(src: str | Path, dst: str | Path) -> Path:
    """Write the authors' CLIP ``.pth`` as a transformers ``CLIPVisionModel`` folder
    (config.json + model.safetensors), its dtype kept."""
    authors = read_authors_clip(src)
    model = load_authors_clip(src, dtype=authors["visual.patch_embedding.weight"].dtype)
    dst = Path(dst)
    model.save_pretrained(dst)
    return dst


class ImageEncoder:
    """One CLIPVisionModel; ``encode(frame)`` -> (1, N, width) tokens of a uint8 frame."""

    def __init__(self, model) -> None:
        self.model = model.eval().requires_grad_(False)
        self.size: int = int(model.config.image_size)
        self.dim: int = int(model.config.hidden_size)

    @classmethod
    def load(cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
             ) -> ImageEncoder:
        """``path``: a ``CLIPVisionModel`` folder or the authors' ``.pth``."""
        from transformers import CLIPVisionModel

        path = Path(path)
        if path.is_file():
            return cls(load_authors_clip(path, dtype=dtype, device=device))
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"CLIP image encoder {path} has no config.json")
        model = CLIPVisionModel.from_pretrained(path, local_files_only=True, dtype=dtype)
        return cls(model.to(device))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def encode(self, frame: np.ndarray) -> torch.Tensor:
        """frame (H, W, 3) uint8 -> tokens (1, N, dim) float32 on the model's device."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"CLIP takes a (H, W, 3) uint8 frame, got {frame.dtype} {frame.shape}")
        x = torch.from_numpy(np.ascontiguousarray(frame)).to(self.device).permute(2, 0, 1)[None].float() / 255.0
        x = F.interpolate(x, size=(self.size, self.size), mode="bicubic", align_corners=False)
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        x = ((x - mean) / std).to(next(self.model.parameters()).dtype)
        out = self.model(pixel_values=x, output_hidden_states=True)
        return out.hidden_states[-2].float()  # (1, N, dim): after the penultimate layer
