"""Checked msgpack: the bytes-level pieces a snapshot, a session log and a hand-off share
(session/snapshot.py, session/logfile.py, session/handoff.py): one reader, one way to fail.

``unpack`` reads bytes of bounded size as msgpack (string keys, no ext types); ``Fields`` reads
a decoded map that must hold exactly the expected keys, field by field, each checked for type
and range, raising ``SnapshotError`` that names the field; ``pack_array`` and
``Fields.get_array`` carry typed numpy arrays as {dtype, shape, data}.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from worldserve.session.errors import SnapshotError

MAX_INT = 2**63 - 1
DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(code)
    for name, code in [
        ("uint8", "|u1"),
        ("uint16", "<u2"),
        ("float16", "<f2"),
        ("float32", "<f4"),
        ("float64", "<f8"),
        ("int32", "<i4"),
        ("int64", "<i8"),
    ]
}


def unpack(data: bytes, max_bytes: int) -> object:
    """Bytes of at most ``max_bytes`` as msgpack (string keys, no ext types); SnapshotError
    if they are not."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SnapshotError(f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise SnapshotError(f"{len(data)} bytes, over the limit of {max_bytes}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:  # the C unpacker raises a zoo of types on bad input
        raise SnapshotError(f"not valid msgpack: {type(exc).__name__}: {exc}") from exc


def pack_array(arr: np.ndarray) -> dict[str, object]:
    name = arr.dtype.name
    if name not in DTYPES:
        raise SnapshotError(f"dtype {name} is not one of {sorted(DTYPES)}")
    flat = np.ascontiguousarray(arr, dtype=DTYPES[name])
    return {"dtype": name, "shape": list(arr.shape), "data": flat.tobytes()}


class Fields:
    """A decoded msgpack map with exactly the expected keys (``optional`` ones may be absent
    or nil), read field by field."""

    __slots__ = ("_d", "path")

    def __init__(self, obj: object, path: str, keys: set[str], optional: frozenset[str] = frozenset()) -> None:
        if not isinstance(obj, dict):
            raise SnapshotError(f"{path}: expected a map, got {type(obj).__name__}")
        if not keys <= set(obj) <= keys | optional:
            missing, extra = sorted(keys - set(obj)), sorted(map(repr, set(obj) - keys - optional))
            raise SnapshotError(f"{path}: missing keys {missing}, unexpected keys {extra}")
        self._d: dict[str, object] = obj
        self.path = path

    def _fail(self, key: str, what: str, value: object) -> SnapshotError:
        shown = (
            repr(value) if isinstance(value, int | float | bool | None) else type(value).__name__
        )
        return SnapshotError(f"{self.path}.{key}: expected {what}, got {shown}")

    def get_int(self, key: str, lo: int, hi: int) -> int:
        v = self._d[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self._fail(key, f"an int in [{lo}, {hi}]", v)
        return v

    def get_float(self, key: str) -> float:
        v = self._d[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self._fail(key, "a finite number", v)
        return float(v)

    def get_str(self, key: str, max_chars: int) -> str:
        v = self._d[key]
        if not isinstance(v, str) or len(v) > max_chars:
            raise self._fail(key, f"a str of at most {max_chars} chars", v)
        return v

    def get_bin(self, key: str, max_len: int) -> bytes:
        v = self._d[key]
        if not isinstance(v, bytes) or len(v) > max_len:
            raise self._fail(key, f"bytes of at most {max_len}", v)
        return v

    def get_list(self, key: str, max_len: int) -> list[object]:
        v = self._d[key]
        if not isinstance(v, list) or len(v) > max_len:
            raise self._fail(key, f"a list of at most {max_len} items", v)
        return v

    def get_map(self, key: str, keys: set[str], optional: frozenset[str] = frozenset()) -> Fields:
        return Fields(self._d[key], f"{self.path}.{key}", keys, optional)

    def present(self, key: str) -> bool:
        """An optional field that is there and not nil."""
        return self._d.get(key) is not None

    def get_optional_array(self, key: str, dtype: str, ndim: int) -> np.ndarray | None:
        """A typed array field, or None where it is nil."""
        return None if self._d[key] is None else self.get_array(key, dtype, ndim)

    def get_array(self, key: str, dtype: str, ndim: int) -> np.ndarray:
        """A typed array field of the given dtype and rank."""
        return self._array(key, (dtype,), (ndim,))

    def get_named_arrays(self, key: str, max_entries: int, max_ndim: int) -> dict[str, np.ndarray]:
        """A map of at most ``max_entries`` str keys to arrays of any dtype of ``DTYPES`` and
        rank up to ``max_ndim``: what the keys name and hold is checked by its reader."""
        v = self._d[key]
        if not isinstance(v, dict) or len(v) > max_entries or not all(isinstance(k, str) for k in v):
            raise self._fail(key, f"a map of at most {max_entries} str keys", v)
        inner = Fields(v, f"{self.path}.{key}", set(v))
        ranks = tuple(range(max_ndim + 1))
        return {name: inner._array(name, tuple(DTYPES), ranks) for name in v}

    def _array(self, key: str, dtypes: tuple[str, ...], ranks: tuple[int, ...]) -> np.ndarray:
        m = self.get_map(key, {"dtype", "shape", "data"})
        name = m.get_str("dtype", 16)
        if name not in DTYPES or name not in dtypes:
            want_dtype = repr(dtypes[0]) if len(dtypes) == 1 else f"one of {list(dtypes)}"
            raise SnapshotError(f"{m.path}.dtype: expected {want_dtype}, got {name[:16]!r}")
        shape_list = m.get_list("shape", 8)
        ndim = len(shape_list) if len(shape_list) in ranks else ranks[-1]
        if len(shape_list) != ndim or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_INT for n in shape_list
        ):
            count = ndim if len(ranks) == 1 else f"at most {ranks[-1]}"
            raise SnapshotError(f"{m.path}.shape: expected {count} non-negative ints")
        shape = tuple(n for n in shape_list if isinstance(n, int))
        data = m._d["data"]
        if not isinstance(data, bytes):
            raise m._fail("data", "bytes", data)
        want = math.prod(shape) * DTYPES[name].itemsize
        if want != len(data):
            raise SnapshotError(
                f"{m.path}: shape {shape} of {name} needs {want} bytes, got {len(data)}"
            )
        return (
            np.frombuffer(data, dtype=DTYPES[name])
            .reshape(shape)
            .astype(DTYPES[name].newbyteorder("="))
        )
