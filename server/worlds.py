"""Saved worlds: a session's exact state under a name, to fork new sessions from.

A world is two objects in the store (``server/store/``): ``worlds/<id>/state``, the session's
snapshot (``session/snapshot.py``: its frames, KV cache, reference memory and replay log), and
``worlds/<id>/meta``, a small msgpack map (format, version, id, name, owner, model, frame count,
time saved, the state's size). The state is written first and the meta last, so a world is
listed only once it is whole; a crash between the two leaves an unlisted state that a later
save of the same id overwrites. The owner is kept as the SHA-256 of the session token that
saved it: the owner's token or the admin key deletes it.

Every call blocks (store I/O): the server runs them on a worker thread.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import asdict, dataclass

import msgpack

from worldserve.server.store import NoSuchObject, Store, StoreError

WORLD_FORMAT = "worldserve/saved-world"
WORLD_VERSION = 1  # written; read: this one (an older or newer world is refused by its number)
MAX_NAME_CHARS = 80
_META_KEYS = {"format", "version", "id", "name", "owner_sha256", "model", "frames", "saved_at", "state_bytes"}


class WorldError(StoreError):
    code = "bad_world"


class UnknownWorld(WorldError):
    code = "unknown_world"


@dataclass(frozen=True)
class WorldMeta:
    id: str
    name: str
    owner_sha256: str
    model: str
    frames: int
    saved_at: float
    state_bytes: int

    def public(self) -> dict[str, object]:
        """What ``GET /v1/worlds`` shows: everything but the owner's token hash."""
        out = asdict(self)
        del out["owner_sha256"]
        return out


def _check_id(world_id: str) -> str:
    if not (isinstance(world_id, str) and 8 <= len(world_id) <= 64 and world_id.replace("-", "").replace("_", "")
            .isalnum() and world_id.isascii()):
        raise UnknownWorld(f"no world {world_id!r}")
    return world_id


class WorldShelf:
    """The saved worlds of one store."""

    def __init__(self, store: Store, max_worlds: int = 10_000):
        self.store, self.max_worlds = store, max_worlds

    def save(self, name: str, owner_sha256: str, model: str, frames: int, state: bytes) -> WorldMeta:
        """Keep ``state`` (a session snapshot) as a new world named ``name``."""
        name = name.strip()
        if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise WorldError(f"a world's name is 1-{MAX_NAME_CHARS} printable characters, got {name[:100]!r}")
        if sum(n.endswith("/meta") for n in self.store.list("worlds")) >= self.max_worlds:
            raise WorldError(f"the store holds its limit of {self.max_worlds} worlds: delete one first")
        # an object name starts with a letter or digit; a token may start with - or _
        meta = WorldMeta(id="w" + secrets.token_urlsafe(12), name=name, owner_sha256=owner_sha256, model=model,
                         frames=frames, saved_at=time.time(), state_bytes=len(state))
        self.store.put(f"worlds/{meta.id}/state", state, kind=WORLD_VERSION)
        doc = {"format": WORLD_FORMAT, "version": WORLD_VERSION, **asdict(meta)}
        self.store.put(f"worlds/{meta.id}/meta", msgpack.packb(doc, use_bin_type=True), kind=WORLD_VERSION)
        return meta

    def meta(self, world_id: str) -> WorldMeta:
        try:
            kind, raw = self.store.get(f"worlds/{_check_id(world_id)}/meta")
        except NoSuchObject:
            raise UnknownWorld(f"no world {world_id!r}") from None
        return self._read_meta(world_id, kind, raw)

    def state(self, world_id: str) -> tuple[WorldMeta, bytes]:
        """A world's meta and its state, for a fork; its version is checked before its state is read."""
        meta = self.meta(world_id)
        try:
            kind, state = self.store.get(f"worlds/{meta.id}/state")
        except NoSuchObject:
            raise UnknownWorld(f"world {world_id!r} has lost its state") from None
        if kind != WORLD_VERSION or len(state) != meta.state_bytes:
            raise WorldError(f"world {world_id!r}: its state is not the one its meta describes")
        return meta, state

    def list(self, owner_sha256: str | None = None) -> list[WorldMeta]:
        """Whole worlds, oldest first; an ``owner_sha256`` keeps that owner's only. An unreadable
        meta is left out (its world is reported by ``meta``)."""
        out = []
        for name in self.store.list("worlds"):
            if not name.endswith("/meta"):
                continue
            try:
                meta = self.meta(name.split("/")[1])
            except StoreError:
                continue
            if owner_sha256 is None or hmac.compare_digest(meta.owner_sha256, owner_sha256):
                out.append(meta)
        return sorted(out, key=lambda m: m.saved_at)

    def delete(self, world_id: str, owner_sha256: str | None, admin: bool = False) -> None:
        """Delete a world: its owner (the hash of the token that saved it) or the admin. Another
        caller gets the answer an unknown id gets."""
        meta = self.meta(world_id)
        if not admin and (owner_sha256 is None or not hmac.compare_digest(meta.owner_sha256, owner_sha256)):
            raise UnknownWorld(f"no world {world_id!r}")
        self.store.delete(f"worlds/{meta.id}/meta")  # unlisted first, then its state
        self.store.delete(f"worlds/{meta.id}/state")

    @staticmethod
    def _read_meta(world_id: str, kind: int, raw: bytes) -> WorldMeta:
        if kind != WORLD_VERSION:
            raise WorldError(f"world {world_id!r} is of version {kind}; this server reads version {WORLD_VERSION}")
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0, max_str_len=4096)
        except Exception:
            raise WorldError(f"world {world_id!r}: its meta is not readable") from None
        if not isinstance(doc, dict) or set(doc) != _META_KEYS or doc["format"] != WORLD_FORMAT:
            raise WorldError(f"world {world_id!r}: its meta is not a saved world's")
        if doc["version"] != WORLD_VERSION or doc["id"] != world_id:
            raise WorldError(f"world {world_id!r}: its meta names version {doc['version']}, id {doc['id']!r}")
        try:
            return WorldMeta(**{k: doc[k] for k in _META_KEYS - {"format", "version"}})
        except TypeError:
            raise WorldError(f"world {world_id!r}: its meta is not a saved world's") from None
