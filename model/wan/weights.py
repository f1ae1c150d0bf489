"""Loading the Wan causal family's transformer weights as their authors publish them.

Accepted files:

- a torch ``.pt`` / ``.pth`` checkpoint (Self-Forcing, CausVid, LongLive, Rolling Forcing),
  whose top level maps ``generator_ema`` and/or ``generator`` to state dicts, or is the state
  dict itself. Which one is read is the recipe's (``model/wan/recipes.py``: Self-Forcing and
  Rolling Forcing serve the EMA, CausVid and LongLive the generator); without a recipe,
  ``generator_ema`` where it exists. Keys may carry the ``model.`` prefix of the authors'
  training wrapper and, anywhere in them, the segments their FSDP, activation-checkpointing
  and ``torch.compile`` wrappers add (``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``,
  ``_orig_mod.``, which Rolling Forcing's and LongLive's EMA keys carry); all are stripped, as
  the authors' loaders do. Read with ``torch.load(weights_only=True, mmap=True)``: only tensors
  and plain containers come out, a file that needs a full unpickle is refused, and the state
  dicts not taken (critic, the other generator) are never read into memory.
- ``.safetensors`` (what ``convert`` writes, Matrix-Game's files, Wan2.1's own
  ``diffusion_pytorch_model``), or a ``.safetensors.index.json`` naming shards beside it.

A LoRA (LongLive's ``lora.pt``: PEFT's state dict of the rank-256 adapters on every linear
layer of every block) is merged into the base weights on load: W + (alpha / rank) B A, which is
what PEFT's forward computes.

Every key and shape is checked against the model before anything is copied: a missing key, an
unexpected key or a wrong shape is a ``WeightsError`` naming the file, the key, and what was
expected against what was found.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from worldserve.model.wan.causal import CausalWanModel
from worldserve.model.wan.config import WanConfig

CHECKPOINT_KEYS = ("generator_ema", "generator")  # where the authors' .pt files keep the weights
WRAPPER_PREFIX = "model."  # the authors' training wrapper holds the transformer as .model
# segments that training wrappers insert into parameter names (FSDP, activation checkpointing,
# torch.compile); the authors' loaders strip them
WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
PEFT_PREFIX = "base_model.model."  # PEFT's wrapper around the transformer
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


class WeightsError(ValueError):
    """A weights file that cannot be read, or does not match the model."""


def read_state_dict(path: str | Path, key: str | None = None) -> dict[str, torch.Tensor]:
    """The transformer's state dict from an authors' ``.pt`` or a safetensors file, with the
    wrapper prefix and segments stripped. ``key``: the state dict of a ``.pt`` to take
    (``generator_ema`` or ``generator``, a recipe's ``checkpoint_key``); None takes
    ``generator_ema`` where it exists. Nothing is checked against a model yet."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    name = path.name
    if name.endswith(".safetensors.index.json"):
        state = _read_sharded(path)
    elif name.endswith(".safetensors"):
        try:
            state = load_file(str(path), device="cpu")
        except Exception as e:  # safetensors raises its own error types
            raise WeightsError(f"weights file {path} is not a readable safetensors file: {e}") from None
    elif name.endswith(TORCH_SUFFIXES):
        state = _read_torch(path, key)
    else:
        raise WeightsError(
            f"weights file {path}: unknown format (expected .safetensors, .safetensors.index.json "
            f"or {', '.join(TORCH_SUFFIXES)})"
        )
    return clean_keys(state)


def clean_keys(state: dict[str, torch.Tensor], prefix: str = WRAPPER_PREFIX) -> dict[str, torch.Tensor]:
    """Keys without the wrappers' segments, and without ``prefix`` where every key has it."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        for seg in WRAPPER_SEGMENTS:
            k = k.replace(seg, "")
        out[k] = v
    if len(out) != len(state):
        raise WeightsError(f"{len(state) - len(out)} keys collide once {', '.join(WRAPPER_SEGMENTS)} are stripped")
    if out and all(k.startswith(prefix) for k in out):
        out = {k[len(prefix):]: v for k, v in out.items()}
    return out


def torch_load(path: Path) -> object:
    """``torch.load`` of tensors and plain containers only, memory-mapped where the file allows
    it (the zip format every torch since 1.6 writes), so unread tensors stay on disk."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):
            raise
        return torch.load(path, weights_only=True, map_location="cpu")  # the legacy format cannot be mapped


def _read_torch(path: Path, key: str | None = None) -> dict[str, torch.Tensor]:
    try:
        obj = torch_load(path)
    except pickle.UnpicklingError as e:
        raise WeightsError(
            f"weights file {path} holds objects other than tensors and plain containers; "
            f"refused (it would need a full unpickle): {str(e).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise WeightsError(f"weights file {path} is not a readable torch checkpoint: {e}") from None
    if not isinstance(obj, dict):
        raise WeightsError(f"weights file {path} holds a {type(obj).__name__}, not a dict of tensors")
    if key is not None and key not in obj and any(k in obj for k in CHECKPOINT_KEYS):
        raise WeightsError(f"weights file {path} has no {key!r} state dict (the recipe's); it holds "
                           f"{', '.join(repr(k) for k in CHECKPOINT_KEYS if k in obj)}")
    for k in (key,) if key is not None and key in obj else CHECKPOINT_KEYS:
        if k in obj:
            obj = obj[k]
            if not isinstance(obj, dict):
                raise WeightsError(f"weights file {path}: {k!r} holds a {type(obj).__name__}, not a state dict")
            break
    bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise WeightsError(
            f"weights file {path}: no {' or '.join(repr(k) for k in CHECKPOINT_KEYS)} state dict, and key "
            f"{bad[0]!r} at the top level is not a tensor (top-level keys: {sorted(obj)[:8]})"
        )
    return obj


def _read_sharded(index: Path) -> dict[str, torch.Tensor]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise WeightsError(f"shard index {index} has no readable 'weight_map': {e}") from None
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        part = index.parent / shard
        if not part.is_file():
            raise WeightsError(f"shard index {index} names {part}, which does not exist")
        state.update(load_file(str(part), device="cpu"))
    return state


def check_state_dict(model: CausalWanModel, state: dict[str, torch.Tensor], source: str | Path) -> None:
    """Raise ``WeightsError`` on the first missing key, unexpected key or wrong shape."""
    want = model.state_dict()
    for key, ref in want.items():
        if key not in state:
            raise WeightsError(
                f"weights file {source}: key {key!r} is missing (expected shape {tuple(ref.shape)}; "
                f"{len(state)} keys found)"
            )
        if tuple(state[key].shape) != tuple(ref.shape):
            raise WeightsError(
                f"weights file {source}: key {key!r} has shape {tuple(state[key].shape)}, "
                f"expected {tuple(ref.shape)} for {_describe(model.cfg)}"
            )
    extra = sorted(set(state) - set(want))
    if extra:
        raise WeightsError(
            f"weights file {source}: unexpected key {extra[0]!r} (shape {tuple(state[extra[0]].shape)}; "
            f"{len(extra)} unexpected in all), not part of {_describe(model.cfg)}"
        )


def _describe(cfg: WanConfig) -> str:
    return f"a Wan model of dim {cfg.dim}, {cfg.num_layers} layers, {cfg.num_heads} heads"


def read_lora(path: str | Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A LoRA file (PEFT's state dict, or LongLive's ``{"generator_lora": ...}``) as
    {target module: (A (rank, in), B (out, rank))}, the module named as in the transformer."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"LoRA file {path} does not exist")
    obj = load_file(str(path), device="cpu") if path.name.endswith(".safetensors") else read_tensors(path)
    if "generator_lora" in obj and isinstance(obj["generator_lora"], dict):
        obj = obj["generator_lora"]
    state = clean_keys(obj, PEFT_PREFIX)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in state.items():
        parts = k.split(".")
        if not isinstance(v, torch.Tensor) or ("lora_A" not in parts and "lora_B" not in parts):
            raise WeightsError(f"LoRA file {path}: key {k!r} is not a lora_A / lora_B weight")
        i = parts.index("lora_A") if "lora_A" in parts else parts.index("lora_B")
        pairs.setdefault(".".join(parts[:i]), {})[parts[i]] = v  # "lora_A.weight" or "lora_A.default.weight"
    out = {}
    for module, ab in pairs.items():
        if set(ab) != {"lora_A", "lora_B"}:
            raise WeightsError(f"LoRA file {path}: {module!r} has {sorted(ab)} only, not both lora_A and lora_B")
        a, b = ab["lora_A"], ab["lora_B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise WeightsError(f"LoRA file {path}: {module!r} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
                               f"not (rank, in) and (out, rank)")
        out[module] = (a, b)
    return out


def read_authors_file(path: str | Path, what: str, marker: str) -> dict[str, torch.Tensor]:
    """One of the authors' ``.pth`` files (their key names), memory-mapped: ``what`` names it
    in errors, and ``marker`` is a key it must hold."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} does not exist")
    state = read_tensors(path)
    if marker not in state:
        raise WeightsError(f"{path} is not the authors' {what}: no {marker!r} (keys: {sorted(state)[:4]})")
    return state


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A torch file holding a dict (of tensors), memory-mapped; a full unpickle is refused."""
    try:
        obj = torch_load(path)
    except pickle.UnpicklingError as e:
        raise WeightsError(f"file {path} holds objects other than tensors and plain containers; refused: "
                           f"{str(e).splitlines()[0]}") from None
    if not isinstance(obj, dict):
        raise WeightsError(f"file {path} holds a {type(obj).__name__}, not a dict of tensors")
    return obj


def merge_lora(state: dict[str, torch.Tensor], lora: dict[str, tuple[torch.Tensor, torch.Tensor]], alpha: float,
               source: str | Path = "LoRA") -> dict[str, torch.Tensor]:
    """``state`` with each LoRA target's weight replaced by W + (alpha / rank) B A, computed in
    float32 and stored in W's dtype (PEFT's LoraConfig scaling, ``lora_alpha / r``)."""
    out = dict(state)
    for module, (a, b) in lora.items():
        key = module + ".weight"
        if key not in out:
            raise WeightsError(f"{source}: LoRA target {module!r} is not a weight of the checkpoint")
        w = out[key]
        if tuple(w.shape) != (b.shape[0], a.shape[1]):
            raise WeightsError(f"{source}: LoRA of {module!r} is ({b.shape[0]}, {a.shape[1]}), the weight "
                               f"{tuple(w.shape)}")
        delta = (alpha / a.shape[0]) * (b.float() @ a.float())
        out[key] = (w.float() + delta).to(w.dtype)
    return out


def load_weights(model: CausalWanModel, path: str | Path) -> CausalWanModel:
    """Check and copy a weights file into ``model`` (cast to the model's dtype). Returns it."""
    state = read_state_dict(path)
    check_state_dict(model, state, path)
    model.load_state_dict(state, strict=True)
    return model


def read_merged(path: str | Path, key: str | None = None, lora: str | Path | None = None,
                lora_alpha: float | None = None) -> dict[str, torch.Tensor]:
    """``read_state_dict`` with a LoRA file merged in (``lora_alpha``: the recipe's; None: the
    rank, PEFT's default when alpha is not given)."""
    state = read_state_dict(path, key)
    if lora is not None:
        pairs = read_lora(lora)
        rank = next(iter(pairs.values()))[0].shape[0] if pairs else 1
        state = merge_lora(state, pairs, float(rank if lora_alpha is None else lora_alpha), lora)
    return state


def load_model(
    path: str | Path, cfg: WanConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    *, key: str | None = None, lora: str | Path | None = None, lora_alpha: float | None = None,
) -> CausalWanModel:
    """A ``CausalWanModel`` of ``cfg`` with the weights of ``path`` (its ``key`` state dict, a
    ``lora`` merged in), in eval mode."""
    state = read_merged(path, key, lora, lora_alpha)
    with torch.device("meta"):
        model = CausalWanModel(cfg)
    check_state_dict(model, state, path)
    model = model.to_empty(device=device)
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def convert(src: str | Path, dst: str | Path, *, key: str | None = None, lora: str | Path | None = None,
            lora_alpha: float | None = None) -> Path:
    """Write the transformer's weights of ``src`` (any accepted format; its ``key`` state dict,
    wrappers stripped, a ``lora`` merged in) as one safetensors file at ``dst``; returns its
    path. Dtypes are kept."""
    state = read_merged(src, key, lora, lora_alpha)
    dst = Path(dst)
    if dst.suffix != ".safetensors":
        raise WeightsError(f"convert writes safetensors: {dst} should end in .safetensors")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in state.items()}
    save_file(tensors, str(dst), metadata={"format": "pt", "source": Path(src).name})
    return dst
