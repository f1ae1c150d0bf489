"""Weights as safetensors with the config beside them as JSON. Never unpickles anything.

``name.safetensors`` holds the tensors; ``name.json`` holds the ``ModelConfig``. Loading checks
every key and shape against a model built from that config and names the first mismatch.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from worldserve.model.default import WEIGHTS_DIR
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel

DEFAULT_WEIGHTS = WEIGHTS_DIR / "default.safetensors"
LIVE_PARTS = WEIGHTS_DIR / "live.safetensors"  # the live state's stem, heads and shapes, on top of the default
LIVE_PREFIXES = ("state_stems.", "state_heads.", "state_basis")


class WeightsError(ValueError):
    """A weights file that does not match its config."""


def config_path(weights: str | Path) -> Path:
    return Path(weights).with_suffix(".json")


def save_random_model(path: str | Path, seed: int = 0) -> Path:
    """A random-init default model saved at ``path``, for tools and tests that run where no
    trained weights are. Its zero-initialised layers (adaLN, heads) get small random values:
    as initialised, the model would ignore actions and prompts."""
    torch.manual_seed(seed)
    model = WorldModel(ModelConfig())
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.05)
    return save_model(model, path)


def save_model(model: WorldModel, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    _save_pair(path, state, model.cfg.to_json(), metadata)
    return path


def _save_pair(path: Path, state: dict[str, torch.Tensor], config: str, metadata: dict[str, str] | None) -> None:
    """Tensors and their JSON beside them, each written whole (a temporary file, then renamed):
    a reader never sees half a file."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    save_file(state, str(tmp), metadata=metadata or {})
    os.replace(tmp, path)
    cfg_tmp = config_path(path).with_name(config_path(path).name + f".{os.getpid()}.tmp")
    cfg_tmp.write_text(config + "\n")
    os.replace(cfg_tmp, config_path(path))


def save_live_parts(model: WorldModel, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """The live state's parts of ``model`` alone (``LIVE_PREFIXES``), with the config fields that
    shape them: small, laid on the default weights by ``load_model(..., live_parts=path)``."""
    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()
             if k.startswith(LIVE_PREFIXES)}
    if not state:
        raise WeightsError(f"{path}: the model has no live state parts to save")
    shape = {"state_channels": model.cfg.state_channels, "state_basis": model.cfg.state_basis}
    _save_pair(path, state, json.dumps(shape), metadata)
    return path


def load_state(
    model: WorldModel, state: dict[str, torch.Tensor], source: str, allow_missing: tuple[str, ...] = ()
) -> None:
    """Load ``state`` strictly; keys under an ``allow_missing`` prefix may be absent (a
    checkpoint from before a module was added) and keep the model's initial values."""
    expected = model.state_dict()
    missing = sorted(k for k in set(expected) - set(state) if not k.startswith(allow_missing))
    if missing:
        raise WeightsError(f"{source}: missing key {missing[0]!r} ({len(missing)} missing)")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise WeightsError(f"{source}: unexpected key {unexpected[0]!r} ({len(unexpected)} unexpected)")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise WeightsError(
                f"{source}: key {key!r} has shape {tuple(tensor.shape)}, "
                f"the config expects {tuple(expected[key].shape)}"
            )
    model.load_state_dict(state, strict=False)


def _existing(path: str | Path) -> tuple[Path, Path]:
    path = Path(path).with_suffix(".safetensors")
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")
    if not config_path(path).exists():
        raise FileNotFoundError(f"no config beside the weights: {config_path(path)}")
    return path, config_path(path)


def load_model(path: str | Path = DEFAULT_WEIGHTS, live_parts: str | Path | None = None) -> WorldModel:
    """The weights at ``path``; with ``live_parts`` (``save_live_parts``), the live state's parts
    laid on them (weights that have no live state of their own)."""
    path, cfg_file = _existing(path)
    cfg = ModelConfig.from_json(cfg_file.read_text())
    if live_parts is None:
        model = WorldModel(cfg)
        load_state(model, load_file(str(path)), str(path))
        return model
    if cfg.state_channels:
        raise WeightsError(f"{path} has a live state of its own: no parts are laid on it")
    parts, parts_cfg = _existing(live_parts)
    shape = json.loads(parts_cfg.read_text())
    model = WorldModel(replace(cfg, state_channels=int(shape["state_channels"]), state_basis=int(shape["state_basis"])))
    load_state(model, load_file(str(path)), str(path), allow_missing=LIVE_PREFIXES)
    state = load_file(str(parts))
    missing = sorted(k for k in model.state_dict() if k.startswith(LIVE_PREFIXES) and k not in state)
    if missing or any(not k.startswith(LIVE_PREFIXES) for k in state):
        raise WeightsError(f"{parts}: not the live parts of this model (missing {missing[:1]})")
    load_state(model, {**model.state_dict(), **state}, str(parts))
    return model
