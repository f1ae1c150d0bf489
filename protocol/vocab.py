"""The words server and clients share: action keys, controls, identifier forms, limits.

The session layer (``session/``) builds on these too: a session's action vector, the
seed range and the forms of a session id and a resume token are what the wire carries,
defined here once. numpy only.
"""

from __future__ import annotations

import re

import numpy as np

# Movement keys, in the order of the multi-hot action vector. The action vector of one
# frame is ``[*keys, mouse_dx, mouse_dy]`` as float32 (keys 0/1, mouse in [-1, 1]).
KEYS: tuple[str, ...] = ("forward", "back", "left", "right")
MOUSE_DIMS = 2
ACTION_DIM = len(KEYS) + MOUSE_DIMS
# The controls a model family may take (``started.controls`` on the wire).
CONTROLS: tuple[str, ...] = ("keys", "mouse", "prompt", "observation")

MAX_SEED = 2**64 - 1
MAX_TOKEN_CHARS = 256  # a resume token
SESSION_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def encode_action(keys: frozenset[str] | set[str] | tuple[str, ...], mouse: tuple[float, float]) -> np.ndarray:
    """Multi-hot keys + clipped mouse delta as one float32 action vector."""
    unknown = set(keys) - set(KEYS)
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}; known keys are {list(KEYS)}")
    vec = np.zeros(ACTION_DIM, dtype=np.float32)
    for i, name in enumerate(KEYS):
        if name in keys:
            vec[i] = 1.0
    vec[len(KEYS)] = float(np.clip(mouse[0], -1.0, 1.0))
    vec[len(KEYS) + 1] = float(np.clip(mouse[1], -1.0, 1.0))
    return vec
