"""An object's frame and name: what every store writes and checks on every read.

    magic (8 bytes) | frame version (u32) | kind (u32) | payload length (u64) | SHA-256 (32) | payload

``kind`` is the caller's own format version of the payload (a saved world's, a checkpoint's),
kept outside the payload so a reader refuses an object it cannot read by its number, before
it looks inside. Everything here is plain Python: no I/O.
"""

from __future__ import annotations

import hashlib
import re
import struct

MAGIC = b"WSOBJ\x00\r\n"  # a text-mode copy or a truncated header shows at once
FRAME_VERSION = 1
HEADER = struct.Struct(">8sIIQ32s")
MAX_NAME = 200
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}(/[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}){0,3}")


class StoreError(Exception):
    """Base of the store's errors; ``code`` is the protocol's error code for it."""

    code = "store_error"


class NoSuchObject(StoreError, KeyError):
    code = "not_found"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "no such object"


class CorruptObject(StoreError):
    code = "corrupt_object"


class ObjectTooLarge(StoreError):
    code = "too_large"


def check_name(name: str) -> str:
    """``name`` if it is a valid object name: up to four ``/``-separated parts of letters, digits,
    ``_ . = -``, none starting with a dot (no ``..``, no hidden files, no absolute paths)."""
    if not isinstance(name, str) or len(name) > MAX_NAME or not _NAME.fullmatch(name):
        raise StoreError(f"invalid object name {name!r}: up to 4 parts of [A-Za-z0-9_.=-], "
                         f"each starting with a letter or digit, at most {MAX_NAME} characters")
    return name


def frame(payload: bytes, kind: int, max_bytes: int) -> bytes:
    """``payload`` framed for the store, refused if over ``max_bytes``."""
    if len(payload) > max_bytes:
        raise ObjectTooLarge(f"an object of {len(payload):,} bytes is over the store's cap of {max_bytes:,}")
    digest = hashlib.sha256(payload).digest()
    return HEADER.pack(MAGIC, FRAME_VERSION, kind, len(payload), digest) + payload


def header_length(head: bytes, name: str, max_bytes: int) -> tuple[int, int]:
    """(kind, payload length) from an object's first ``HEADER.size`` bytes, checked."""
    if len(head) < HEADER.size:
        raise CorruptObject(f"{name}: truncated ({len(head)} bytes, not even a header)")
    magic, version, kind, length, _ = HEADER.unpack(head[: HEADER.size])
    if magic != MAGIC:
        raise CorruptObject(f"{name}: not a worldserve object (bad magic)")
    if version != FRAME_VERSION:
        raise CorruptObject(f"{name}: frame version {version}, this server reads {FRAME_VERSION}")
    if length > max_bytes:
        raise ObjectTooLarge(f"{name}: {length:,} bytes, over the store's cap of {max_bytes:,}")
    return kind, length


def unframe(data: bytes, name: str, max_bytes: int) -> tuple[int, bytes]:
    """(kind, payload) of a whole framed object; truncation, padding and any flipped byte are
    refused."""
    kind, length = header_length(data, name, max_bytes)
    payload = data[HEADER.size :]
    if len(payload) != length:
        raise CorruptObject(f"{name}: {len(payload):,} payload bytes where the header says {length:,}")
    if hashlib.sha256(payload).digest() != data[HEADER.size - 32 : HEADER.size]:
        raise CorruptObject(f"{name}: checksum mismatch")
    return kind, payload
