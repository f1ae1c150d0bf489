"""Weights as safetensors with the config beside them as JSON. Never unpickles anything.

``name.safetensors`` holds the tensors; ``name.json`` holds the ``ModelConfig``. Loading checks
every key and shape against a model built from that config and names the first mismatch.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from worldserve.model.default import WEIGHTS_DIR
from worldserve.model.default.net.config import ModelConfig
from worldserve.model.default.net.dit import WorldModel

DEFAULT_WEIGHTS = WEIGHTS_DIR / "default.safetensors"


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
    save_file(state, str(path), metadata=metadata or {})
    config_path(path).write_text(model.cfg.to_json() + "\n")
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


def load_model(path: str | Path = DEFAULT_WEIGHTS) -> WorldModel:
    path = Path(path).with_suffix(".safetensors")
    cfg_file = config_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")
    if not cfg_file.exists():
        raise FileNotFoundError(f"no config beside the weights: {cfg_file}")
    cfg = ModelConfig.from_json(cfg_file.read_text())
    model = WorldModel(cfg)
    load_state(model, load_file(str(path)), str(path))
    return model
