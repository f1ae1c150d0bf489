"""The authors' files in the layouts the server loads: ``worldserve convert SRC DST``.

- the text encoder of every Wan download (``models_t5_umt5-xxl-enc-bf16.pth``: the encoder of
  Wan's own T5 module, their key names) to transformers' ``UMT5EncoderModel``, a folder
  (``config.json`` + ``model.safetensors``). The serving path reads the ``.pth`` the same way
  as it loads (``load_umt5``), so converting only saves that renaming at each start;
- Matrix-Game's CLIP file (``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``, Wan's
  ``XLMRobertaCLIP`` state dict) to transformers' ``CLIPVisionModel``, a folder: the vision
  tower only, renamed by ``model/wan/clip.py`` (which the serving path uses the same way);
- a distilled transformer checkpoint (any ``.pt`` / ``.safetensors`` ``model/wan/weights.py``
  reads) to one safetensors file, with a recipe's state dict taken (``--recipe``: EMA or
  generator), the training wrappers' prefixes stripped and LongLive's LoRA merged in
  (``--lora``).

The renaming from Wan's T5 to transformers' UMT5 is one table (``umt5_key``): per block,
``attn.{q,k,v,o}`` are the self-attention's projections, ``pos_embedding.embedding`` its
relative-position bias (UMT5 has one per layer, as Wan's ``shared_pos=False``), ``ffn.gate.0``
/ ``ffn.fc1`` / ``ffn.fc2`` the gated-GELU's ``wi_0`` / ``wi_1`` / ``wo``, ``norm1`` / ``norm2``
the two RMS norms. Both compute the same thing: unscaled attention with the bucketed bias
(32 buckets, bidirectional, max distance 128), tanh-GELU, RMS norm with eps 1e-6.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

UMT5_MAX_DISTANCE = 128  # Wan's T5RelativeEmbedding max_dist, transformers' relative_attention_max_distance

_BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.+)")


def umt5_key(key: str) -> str:
    """Wan's T5 encoder key -> transformers' UMT5EncoderModel key; KeyError for any other."""
    if key == "token_embedding.weight":
        return "shared.weight"
    if key == "norm.weight":
        return "encoder.final_layer_norm.weight"
    m = _BLOCK_KEY.fullmatch(key)
    if m is None or m.group(2) not in _BLOCK:
        raise KeyError(key)
    return f"encoder.block.{m.group(1)}.{_BLOCK[m.group(2)]}"


def umt5_config(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The UMT5Config fields of a Wan T5 encoder state dict, read from its shapes."""
    vocab, dim = state["token_embedding.weight"].shape
    layers = 1 + max(int(m.group(1)) for k in state if (m := _BLOCK_KEY.fullmatch(k)))
    buckets, heads = state["blocks.0.pos_embedding.embedding.weight"].shape
    ffn = state["blocks.0.ffn.fc1.weight"].shape[0]
    attn = state["blocks.0.attn.q.weight"].shape[0]
    return dict(
        vocab_size=int(vocab), d_model=int(dim), d_kv=int(attn) // int(heads), d_ff=int(ffn), num_layers=layers,
        num_heads=int(heads), relative_attention_num_buckets=int(buckets),
        relative_attention_max_distance=UMT5_MAX_DISTANCE, dropout_rate=0.0, feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )


def read_wan_t5(path: str | Path) -> dict[str, torch.Tensor]:
    """The authors' T5 encoder file (their key names), memory-mapped."""
    from worldserve.model.wan.weights import read_authors_file

    return read_authors_file(path, "T5 text encoder", "token_embedding.weight")


def load_umt5(path: str | Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
    """transformers' ``UMT5EncoderModel`` with the weights of the authors' ``.pth``, in eval mode."""
    from transformers import UMT5Config, UMT5EncoderModel

    state = read_wan_t5(path)
    cfg = UMT5Config(**umt5_config(state))
    with torch.device("meta"):
        model = UMT5EncoderModel(cfg)
    ours = {umt5_key(k): v for k, v in state.items()}
    ours["encoder.embed_tokens.weight"] = ours["shared.weight"]
    model.load_state_dict({k: v.to(dtype) for k, v in ours.items()}, strict=True, assign=True)
    return model.to(device).eval()


def convert_umt5(src: str | Path, dst: str | Path) -> Path:
    """Write the authors' UMT5 ``.pth`` as a transformers folder (config.json + model.safetensors)."""
    state = read_wan_t5(src)
    model = load_umt5(src, dtype=next(iter(state.values())).dtype)
    dst = Path(dst)
    model.save_pretrained(dst)
    return dst


def run(src: Path, dst: Path, *, recipe: str | None = None, lora: Path | None = None) -> Path:
    """``worldserve convert``: by the source's name, the UMT5 encoder or the CLIP image encoder
    to a folder, else a transformer checkpoint to one safetensors file (a recipe's state dict
    and LoRA)."""
    from worldserve.model.wan.clip import convert_clip
    from worldserve.model.wan.layout import CLIP_PTH_FILE, UMT5_PTH_FILE
    from worldserve.model.wan.recipes import get
    from worldserve.model.wan.weights import convert

    if src.name == UMT5_PTH_FILE or "umt5" in src.name:
        return convert_umt5(src, dst)
    if src.name == CLIP_PTH_FILE or "clip" in src.name:
        return convert_clip(src, dst)
    r = get(recipe) if recipe else None
    if r is not None and r.lora is not None and lora is None:
        raise ValueError(f"recipe {r.name} merges its LoRA ({r.lora.name}, {r.lora.where()}): pass --lora")
    alpha = r.lora_alpha if r and r.lora else None
    return convert(src, dst, key=r.checkpoint_key if r else None, lora=lora, lora_alpha=alpha)
