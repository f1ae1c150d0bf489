"""Loading the Wan causal family's transformer weights as their authors publish them.

Accepted files:

- a torch ``.pt`` / ``.pth`` checkpoint (Self-Forcing, CausVid, LongLive, Rolling Forcing),
  whose top level maps ``generator_ema`` (preferred) or ``generator`` to the state dict, or is
  the state dict itself. Keys may carry the ``model.`` prefix of the authors' training wrapper;
  it is stripped. Read with ``torch.load(weights_only=True)``: only tensors and plain
  containers come out; a file that needs a full unpickle is refused.
- ``.safetensors`` (what ``convert`` writes, and Wan2.1's own ``diffusion_pytorch_model``), or
  a ``.safetensors.index.json`` naming shards beside it.

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
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


class WeightsError(ValueError):
    """A weights file that cannot be read, or does not match the model."""


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The transformer's state dict from an authors' ``.pt`` or a safetensors file, with the
    wrapper prefix stripped. Nothing is checked against a model yet."""
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
        state = _read_torch(path)
    else:
        raise WeightsError(
            f"weights file {path}: unknown format (expected .safetensors, .safetensors.index.json "
            f"or {', '.join(TORCH_SUFFIXES)})"
        )
    if state and all(k.startswith(WRAPPER_PREFIX) for k in state):
        state = {k[len(WRAPPER_PREFIX):]: v for k, v in state.items()}
    return state


def _read_torch(path: Path) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise WeightsError(
            f"weights file {path} holds objects other than tensors and plain containers; "
            f"refused (it would need a full unpickle): {str(e).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise WeightsError(f"weights file {path} is not a readable torch checkpoint: {e}") from None
    if not isinstance(obj, dict):
        raise WeightsError(f"weights file {path} holds a {type(obj).__name__}, not a dict of tensors")
    for key in CHECKPOINT_KEYS:
        if key in obj:
            obj = obj[key]
            if not isinstance(obj, dict):
                raise WeightsError(f"weights file {path}: {key!r} holds a {type(obj).__name__}, not a state dict")
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


def load_weights(model: CausalWanModel, path: str | Path) -> CausalWanModel:
    """Check and copy a weights file into ``model`` (cast to the model's dtype). Returns it."""
    state = read_state_dict(path)
    check_state_dict(model, state, path)
    model.load_state_dict(state, strict=True)
    return model


def load_model(
    path: str | Path, cfg: WanConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
) -> CausalWanModel:
    """A ``CausalWanModel`` of ``cfg`` with the weights of ``path``, in eval mode."""
    state = read_state_dict(path)
    with torch.device("meta"):
        model = CausalWanModel(cfg)
    check_state_dict(model, state, path)
    model = model.to_empty(device=device)
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def convert(src: str | Path, dst: str | Path) -> Path:
    """Write the transformer's weights of ``src`` (any accepted format) as one safetensors file
    at ``dst``; returns its path. Dtypes are kept."""
    state = read_state_dict(src)
    dst = Path(dst)
    if dst.suffix != ".safetensors":
        raise WeightsError(f"convert writes safetensors: {dst} should end in .safetensors")
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst), metadata={"format": "pt", "source": Path(src).name})
    return dst
