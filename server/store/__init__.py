"""Objects that outlive a process: saved worlds and crash checkpoints (``docs/operations.md``).

``open_store(url)`` gives a ``Store``: a local directory by default (the embedded server needs
nothing else), or any fsspec URL (``s3://bucket/prefix`` through s3fs) for clusters. Every
object is framed (``objects.py``: a magic, a format version, its length and SHA-256), so a
truncated or corrupt object is refused by name and never served; writes are whole (a temporary
file renamed, or the object store's own single PUT); names are checked; sizes are capped.
"""

from worldserve.server.store.objects import (
    CorruptObject,
    NoSuchObject,
    ObjectTooLarge,
    StoreError,
    check_name,
)
from worldserve.server.store.stores import FsspecStore, LocalStore, Store, open_store, resolve_store

__all__ = [
    "CorruptObject", "FsspecStore", "LocalStore", "NoSuchObject", "ObjectTooLarge", "Store", "StoreError",
    "check_name", "open_store", "resolve_store",
]
