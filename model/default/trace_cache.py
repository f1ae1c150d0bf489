"""Recorded chunk traces kept on disk between starts, so a restarted worker skips recording.

A warm-up on the CPU spends most of its time recording traces (``bench.warmup_cost``); a
worker restarted in a drill or after a crash records the very same ones again. The cache
keeps each serialized trace under a key of everything it depends on: the pickled model
(weights, dtypes, configuration, module layout), the dtype of its buffers, the shape
(bucket, steps, batch), the source of the model package (the code the trace recorded) and
the torch version. Any change to one of them is a new key, so an entry is never stale, only
unused. Writes go to a temporary file renamed into place (workers that start together may
write the same entry); a file that does not load is deleted and recorded again. Past
``limit_mb`` the least recently used entries go.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from worldserve.model.default.trace_recorder import load_trace, model_bytes, record_serialized

if TYPE_CHECKING:
    from worldserve.model.default.chunk_graph import ChunkGraphs
    from worldserve.model.default.net.dit import WorldModel

log = logging.getLogger(__name__)

_MODEL_DIR = Path(__file__).resolve().parent.parent  # model/: every module a trace records


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/worldserve/traces`` (``~/.cache/worldserve/traces``; the system's
    temporary directory where there is no home)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):
            base = tempfile.gettempdir()
    return Path(base) / "worldserve" / "traces"


def code_digest() -> str:
    """A digest of the model package's source: a trace records this code."""
    h = hashlib.sha256(torch.__version__.encode())
    for path in sorted(_MODEL_DIR.rglob("*.py")):
        h.update(str(path.relative_to(_MODEL_DIR)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class TraceCache:
    def __init__(self, root: Path, model_bytes: bytes, dtype: torch.dtype, limit_mb: float = 1024.0):
        self.root, self.limit_mb = root, limit_mb
        h = hashlib.sha256(model_bytes)
        h.update(str(dtype).encode())
        h.update(code_digest().encode())
        self._base = h.hexdigest()[:32]

    def path(self, shape: tuple[int, int, int]) -> Path:
        bucket, steps, batch = shape
        return self.root / f"{self._base}-b{bucket}-s{steps}-n{batch}.pt"

    def load(self, shape: tuple[int, int, int]) -> torch.jit.ScriptModule | None:
        """The cached trace of ``shape``, or None (missing, or unreadable: then deleted)."""
        path = self.path(shape)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            traced = load_trace(data)
        except Exception as exc:  # a torn or foreign file: record it again
            log.warning("trace cache entry %s does not load, recording it again: %s", path.name, exc)
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used
        return traced

    def store(self, shape: tuple[int, int, int], data: bytes) -> None:
        """Keep ``data`` (a serialized trace) for ``shape``; a cache that cannot be written
        only costs the next start its recording."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path(shape))
            self._trim()
        except OSError as exc:
            log.warning("trace cache %s not written: %s", self.root, exc)

    def _trim(self) -> None:
        """Past ``limit_mb``, the least recently used entries go; so do temporary files a
        writer that died left an hour ago or more. Another worker may trim at the same time."""
        now, entries = time.time(), []
        for p in self.root.iterdir():
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if p.suffix == ".tmp" and now - st.st_mtime > 3600:
                p.unlink(missing_ok=True)
            elif p.suffix == ".pt":
                entries.append((st.st_mtime_ns, st.st_size, p))
        entries.sort()
        total = sum(size for _, size, _ in entries)
        for _, size, p in entries:
            if total <= self.limit_mb * 1e6:
                break
            p.unlink(missing_ok=True)
            total -= size


def gather_traces(graphs: ChunkGraphs, model: WorldModel, dtype: torch.dtype, root: Path | None,
                  shapes: list[tuple[int, int, int]]) -> None:
    """Give ``graphs`` a trace for each of ``shapes`` it lacks: from the cache under ``root``
    (None: no cache), else recorded in child processes (``trace_recorder``) and kept in the
    cache. Should the children fail, the warm-up records those in this process as it runs."""
    todo = sorted({s for s in shapes if not graphs.has_trace(*s)})
    if not todo:
        return
    t0 = time.perf_counter()
    blob_in = model_bytes(model)
    cache = None if root is None else TraceCache(root, blob_in, dtype)
    found = {s: cache.load(s) for s in todo} if cache is not None else {}
    missing = [s for s in todo if found.get(s) is None]
    if missing:
        try:
            blobs = record_serialized(blob_in, dtype, missing)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            log.warning("recording traces in child processes failed, recording them here: %s", exc)
            blobs = []
        for shape, blob in zip(missing, blobs, strict=False):
            found[shape] = load_trace(blob)
            if cache is not None:
                cache.store(shape, blob)
    for shape, tr in found.items():
        if tr is not None:
            graphs.adopt(*shape, tr)
    recorded = sum(found.get(s) is not None for s in missing)
    log.info("%d chunk traces: %d from the trace cache, %d recorded in child processes, in %.1f s",
             len(todo), len(todo) - len(missing), recorded, time.perf_counter() - t0)
