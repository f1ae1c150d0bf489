"""A model family's own state on the wire: named arrays only the family reads.

``ModelState.family_state`` (session/plan.py) carries what a family keeps beside its frames
(the default family: its cache's keys and values and its reference's memory; Matrix-Game: the
actions its window was made with). ``session/`` checks only the envelope (``check_envelope``:
names, dtypes, ranks, finite floats, total size); each family packs its entries and checks
what they mean with ``entry`` and ``scalar`` when it restores, so a third family never edits
``session/``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")
MAX_ENTRIES = 64
MAX_NDIM = 6
MAX_STATE_BYTES = 48 << 20  # inside a snapshot's 64 MiB (session/snapshot.py)
DTYPES = frozenset({"uint8", "uint16", "int32", "int64", "float16", "float32", "float64"})


def check_envelope(state: Mapping[str, np.ndarray], path: str = "family_state") -> None:
    """ValueError, naming the entry, unless ``state`` is at most ``MAX_ENTRIES`` arrays under
    names matching ``NAME``, of dtypes in ``DTYPES`` and rank at most ``MAX_NDIM``, floats all
    finite, ``MAX_STATE_BYTES`` in all."""
    if len(state) > MAX_ENTRIES:
        raise ValueError(f"{path}: {len(state)} entries, over {MAX_ENTRIES}")
    total = 0
    for name, arr in state.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"{path}: entry name {str(name)[:64]!r} is not {NAME.pattern}")
        if not isinstance(arr, np.ndarray) or arr.dtype.name not in DTYPES or arr.ndim > MAX_NDIM:
            shown = f"{arr.dtype.name} of rank {arr.ndim}" if isinstance(arr, np.ndarray) else type(arr).__name__
            raise ValueError(f"{path}.{name}: expected an array of {sorted(DTYPES)}, rank <= {MAX_NDIM}, got {shown}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ValueError(f"{path}.{name}: not all finite")
        total += arr.nbytes
    if total > MAX_STATE_BYTES:
        raise ValueError(f"{path}: {total} bytes, over {MAX_STATE_BYTES}")


def entry(state: Mapping[str, np.ndarray], name: str, dtype: str, shape: tuple[int | None, ...],
          *, optional: bool = False, family: str = "family_state") -> np.ndarray | None:
    """The entry ``name`` of ``dtype`` and ``shape`` (None: any length on that axis), or None
    where it is absent and ``optional``; ValueError naming the entry otherwise."""
    arr = state.get(name)
    if arr is None:
        if optional:
            return None
        raise ValueError(f"{family}.{name}: missing")
    fits = arr.ndim == len(shape) and all(w is None or w == n for w, n in zip(shape, arr.shape, strict=True))
    if arr.dtype.name != dtype or not fits:
        want = "(" + ", ".join("N" if w is None else str(w) for w in shape) + ")"
        raise ValueError(f"{family}.{name}: expected {dtype} {want}, got {arr.dtype.name} {arr.shape}")
    return arr


def scalar(state: Mapping[str, np.ndarray], name: str, lo: int, hi: int, *, family: str = "family_state") -> int:
    """The int64 scalar entry ``name``, in [lo, hi]; ValueError naming it otherwise."""
    arr = entry(state, name, "int64", (), family=family)
    assert arr is not None
    v = int(arr)
    if not lo <= v <= hi:
        raise ValueError(f"{family}.{name}: expected an int in [{lo}, {hi}], got {v}")
    return v


def pack_scalar(v: int) -> np.ndarray:
    """An int as a family-state entry (an int64 scalar)."""
    return np.asarray(v, np.int64)
