"""Scenes of the world: the prompt vocabulary and attributes (``model/default/prompt.py``, shared
with serving, which parses prompts without the world) and random scenes for training.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from worldserve.model.default.prompt import ATTRIBUTES, SCENE_DIM, VOCAB, SceneAttrs, parse_prompt

__all__ = ["ATTRIBUTES", "SCENE_DIM", "VOCAB", "SceneAttrs", "parse_prompt", "sample_scene"]


# Sampling weights for training scenes, per attribute value (normalised on use).
_SAMPLE_WEIGHTS: Mapping[str, tuple[float, ...]] = MappingProxyType(
    {
        "biome": (1.0, 1.0, 1.0, 1.0),
        "vegetation": (1.0, 1.0, 1.0),
        "time": (2.0, 1.0, 1.0),
        "weather": (3.0, 1.5, 1.0, 1.0, 1.0),
        "season": (1.0, 1.0, 1.0),
    }
)


def sample_scene(rng: np.random.Generator) -> SceneAttrs:
    """A random scene; clear daytime is the most common, as in ``_SAMPLE_WEIGHTS``."""
    chosen: dict[str, str] = {}
    for name, values in ATTRIBUTES.items():
        w = np.asarray(_SAMPLE_WEIGHTS[name], dtype=np.float64)
        chosen[name] = values[int(rng.choice(len(values), p=w / w.sum()))]
    return SceneAttrs(**chosen)
