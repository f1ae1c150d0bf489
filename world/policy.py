"""Open-loop action policies for training data: ``policy(length, rng) -> (length, ACTION_DIM)``.

random     segments of 4–40 frames: 15 % idle; otherwise one key (55 %), two perpendicular
           keys (22 %), two opposite keys that cancel (3 %) or none (20 %), each with the
           mouse off (half the time) or on a smooth random walk in [-1, 1]².
scripted   a chain of manoeuvres: straight runs (keys, or a constant mouse vector),
           circles with the mouse (1–2 turns, so the camera comes back), zig-zags, out
           and back along a line (revisits places), squares, and idle stretches.
keys       the random policy with the mouse off: whole-pixel shifts only (a curriculum start).
mixed      random or scripted, half and half, per call.
calm       long still stretches (60 % of segments) between random moves: a person who
           looks around, stops, and watches the world move on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np

from worldserve.protocol.vocab import ACTION_DIM, KEYS

ActionPolicy = Callable[[int, np.random.Generator], np.ndarray]
_FWD, _BACK, _LEFT, _RIGHT = (KEYS.index(k) for k in ("forward", "back", "left", "right"))
_MOUSE = slice(len(KEYS), len(KEYS) + 2)
_OPPOSITE = MappingProxyType({_FWD: _BACK, _BACK: _FWD, _LEFT: _RIGHT, _RIGHT: _LEFT})


def _mouse_walk(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 2) smooth random walk in [-1, 1]²."""
    start = rng.uniform(-1, 1, 2)
    drift = np.cumsum(rng.normal(0, 0.12, (n, 2)), axis=0)
    return np.clip(start + drift, -1.0, 1.0)


def random_policy(length: int, rng: np.random.Generator) -> np.ndarray:
    out = np.zeros((length, ACTION_DIM), dtype=np.float32)
    t = 0
    while t < length:
        n = min(int(rng.integers(4, 41)), length - t)
        seg = out[t : t + n]
        if rng.random() >= 0.15:
            r = rng.random()
            first = int(rng.integers(4))
            if r < 0.55:
                seg[:, first] = 1.0
            elif r < 0.77:
                other = int(
                    rng.choice((_LEFT, _RIGHT) if first in (_FWD, _BACK) else (_FWD, _BACK))
                )
                seg[:, [first, other]] = 1.0
            elif r < 0.80:
                seg[:, [first, _OPPOSITE[first]]] = 1.0
            if rng.random() < 0.5 or r >= 0.80:
                seg[:, _MOUSE] = _mouse_walk(rng, n)
        t += n
    return out


def _maneuver(rng: np.random.Generator) -> np.ndarray:
    kind = int(rng.integers(7))
    if kind == 0:  # straight run on keys, sometimes diagonal
        n = int(rng.integers(10, 41))
        seg = np.zeros((n, ACTION_DIM), np.float32)
        first = int(rng.integers(4))
        seg[:, first] = 1.0
        if rng.random() < 0.35:
            seg[:, _LEFT if first in (_FWD, _BACK) else _FWD] = 1.0
        return seg
    if kind == 1:  # straight run on the mouse
        n = int(rng.integers(10, 41))
        seg = np.zeros((n, ACTION_DIM), np.float32)
        ang, mag = rng.uniform(0, 2 * np.pi), rng.uniform(0.3, 1.0)
        seg[:, _MOUSE] = mag * np.array([np.cos(ang), np.sin(ang)])
        return seg
    if kind == 2:  # circle with the mouse: 1-2 full turns
        period = int(rng.integers(16, 49))
        n = period * int(rng.integers(1, 3))
        phase = rng.uniform(0, 2 * np.pi) + (2 * np.pi / period) * np.arange(n) * rng.choice(
            (-1, 1)
        )
        seg = np.zeros((n, ACTION_DIM), np.float32)
        seg[:, _MOUSE] = rng.uniform(0.4, 1.0) * np.stack([np.cos(phase), np.sin(phase)], 1)
        return seg
    if kind == 3:  # zig-zag: forward, alternating left and right
        k, n = int(rng.integers(4, 11)), int(rng.integers(20, 61))
        seg = np.zeros((n, ACTION_DIM), np.float32)
        seg[:, _FWD] = 1.0
        side = (np.arange(n) // k) % 2
        seg[side == 0, _LEFT] = 1.0
        seg[side == 1, _RIGHT] = 1.0
        return seg
    if kind == 4:  # out and back along a line, once or twice
        key, n = int(rng.integers(4)), int(rng.integers(8, 31))
        leg = np.zeros((2 * n, ACTION_DIM), np.float32)
        leg[:n, key] = 1.0
        leg[n:, _OPPOSITE[key]] = 1.0
        return np.tile(leg, (int(rng.integers(1, 3)), 1))
    if kind == 5:  # square: forward, right, back, left
        n = int(rng.integers(6, 21))
        seg = np.zeros((4 * n, ACTION_DIM), np.float32)
        for i, key in enumerate((_FWD, _RIGHT, _BACK, _LEFT)):
            seg[i * n : (i + 1) * n, key] = 1.0
        return seg
    return np.zeros((int(rng.integers(5, 31)), ACTION_DIM), np.float32)  # idle


def scripted_policy(length: int, rng: np.random.Generator) -> np.ndarray:
    parts: list[np.ndarray] = []
    total = 0
    while total < length:
        parts.append(_maneuver(rng))
        total += len(parts[-1])
    if not parts:
        return np.zeros((0, ACTION_DIM), np.float32)
    return np.concatenate(parts)[:length].astype(np.float32)


def keys_policy(length: int, rng: np.random.Generator) -> np.ndarray:
    out = random_policy(length, rng)
    out[:, _MOUSE] = 0.0
    return out


def calm_policy(length: int, rng: np.random.Generator) -> np.ndarray:
    out = random_policy(length, rng)
    t = 0
    while t < length:
        n = int(rng.integers(4, 41))
        if rng.random() < 0.6:
            out[t : t + n] = 0.0
        t += n
    return out


def mixed_policy(length: int, rng: np.random.Generator) -> np.ndarray:
    return random_policy(length, rng) if rng.random() < 0.5 else scripted_policy(length, rng)


POLICIES: Mapping[str, ActionPolicy] = MappingProxyType(
    {
        "random": random_policy,
        "scripted": scripted_policy,
        "keys": keys_policy,
        "mixed": mixed_policy,
        "calm": calm_policy,
    }
)


def resolve_policy(policy: str | ActionPolicy) -> ActionPolicy:
    if callable(policy):
        return policy
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {sorted(POLICIES)}")
    return POLICIES[policy]
