"""The stores: a local directory, or any fsspec URL. Blocking calls: the server runs them on a
worker thread (``asyncio.to_thread``), never on its event loop."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Protocol

from worldserve.server.store.objects import (
    HEADER,
    NoSuchObject,
    StoreError,
    check_name,
    frame,
    header_length,
    unframe,
)

DEFAULT_MAX_BYTES = 256 * 2**20  # a saved world or checkpoint of the default model is well under 1 MiB


class Store(Protocol):
    url: str
    max_bytes: int

    def put(self, name: str, payload: bytes, kind: int = 0) -> None:
        """Write ``payload`` under ``name`` whole: a reader sees the old object or the new one."""

    def get(self, name: str) -> tuple[int, bytes]:
        """(kind, payload); ``NoSuchObject``, ``CorruptObject`` or ``ObjectTooLarge``."""

    def delete(self, name: str) -> bool:
        """Whether there was an object to delete."""

    def list(self, prefix: str = "") -> list[str]:
        """The names under ``prefix`` (a folder, ``""`` for all), sorted."""


class LocalStore:
    """Objects as files under ``root`` (made 0700; refused if another user owns it or others may
    write to it). A write goes to a hidden temporary file beside its target, is flushed to disk,
    then renamed over it."""

    def __init__(self, root: str | Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root).expanduser().absolute()
        self.url, self.max_bytes = str(self.root), max_bytes
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.root.stat()
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise StoreError(f"store {self.root} is owned by another user (uid {st.st_uid})")
        if st.st_mode & 0o022:
            raise StoreError(f"store {self.root} may be written by others (mode {st.st_mode & 0o777:o}): chmod 700 it")

    def _path(self, name: str) -> Path:
        return self.root / check_name(name)

    def put(self, name: str, payload: bytes, kind: int = 0) -> None:
        data = frame(payload, kind, self.max_bytes)
        path = self._path(name)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, name: str) -> tuple[int, bytes]:
        path = self._path(name)
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER.size)
                _, length = header_length(head, name, self.max_bytes)
                data = head + f.read(length + 1)  # one byte more: a padded object is refused too
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NoSuchObject(f"no object {name!r} in the store") from None
        return unframe(data, name, self.max_bytes)

    def delete(self, name: str) -> bool:
        try:
            self._path(name).unlink()
            return True
        except FileNotFoundError:
            return False

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))


class FsspecStore:
    """Objects under an fsspec URL (``s3://bucket/prefix``; ``options`` go to the filesystem,
    e.g. ``endpoint_url`` through ``client_kwargs``). A write is one ``pipe`` of the whole
    object: an object store's PUT is atomic."""

    def __init__(self, url: str, max_bytes: int = DEFAULT_MAX_BYTES, **options: Any):
        import fsspec  # only where a store is configured

        self.fs, root = fsspec.core.url_to_fs(url, **options)
        self.root, self.url, self.max_bytes = root.rstrip("/"), url, max_bytes

    def _path(self, name: str) -> str:
        return f"{self.root}/{check_name(name)}"

    def put(self, name: str, payload: bytes, kind: int = 0) -> None:
        self.fs.pipe_file(self._path(name), frame(payload, kind, self.max_bytes))

    def get(self, name: str) -> tuple[int, bytes]:
        path = self._path(name)
        try:
            head = self.fs.cat_file(path, start=0, end=HEADER.size)
            _, length = header_length(head, name, self.max_bytes)
            data = head + self.fs.cat_file(path, start=HEADER.size, end=HEADER.size + length + 1) if length else head
        except FileNotFoundError:
            raise NoSuchObject(f"no object {name!r} in the store") from None
        return unframe(data, name, self.max_bytes)

    def delete(self, name: str) -> bool:
        path = self._path(name)
        try:
            if not self.fs.exists(path):
                return False
            self.fs.rm_file(path)
            return True
        except FileNotFoundError:
            return False

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        start = len(self.root) + 1
        return sorted(p[start:] for p in found if not p.rsplit("/", 1)[-1].startswith("."))


def open_store(url: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, **options: Any) -> Store:
    """A directory (a path, or ``file://``) or any other fsspec URL."""
    text = str(url)
    if "://" not in text:
        return LocalStore(text, max_bytes)
    if text.startswith("file://"):
        return LocalStore(text.removeprefix("file://"), max_bytes)
    return FsspecStore(text, max_bytes, **options)


def resolve_store(value: str | None, env: dict[str, str] | None = None) -> str | None:
    """The store a ``--store`` value names: None for off (``none``, empty), ``auto``: a private
    directory under the user's data directory ($XDG_DATA_HOME/worldserve/store, else
    ~/.local/share/worldserve/store) where it can be made and written, else None."""
    if value is None or value.strip().lower() in ("", "none", "off"):
        return None
    if value != "auto":
        return value
    env = dict(os.environ) if env is None else env
    base = Path(env.get("XDG_DATA_HOME") or Path(env.get("HOME", "~")).expanduser() / ".local" / "share")
    root = base / "worldserve" / "store"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return str(root) if os.access(root, os.W_OK) else None
