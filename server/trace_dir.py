"""The trace cache's directory, checked before the model loads anything from it.

The default model keeps its recorded CPU chunk traces between starts (``trace_cache``;
model/default/trace_cache.py). They are TorchScript: loading one runs code. So the directory
they are loaded from must be this process user's alone: owned by it and writable by no one
else, the directory and every entry in it. ``checked`` answers the directory to use: the
configured (or default) one where it passes, created ``0700`` where it is missing, else a
private one (``<tmp>/worldserve-traces-<uid>``, checked the same way, or a fresh ``mkdtemp``),
with a warning that says why.

torch-free: the server resolves the directory and hands it to the model registry.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

log = logging.getLogger("worldserve.app")

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/worldserve/traces`` (``~/.cache/worldserve/traces``; under the
    system's temporary directory, per user, where there is no home)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):
            return Path(tempfile.gettempdir()) / f"worldserve-traces-{os.getuid()}"
    return Path(base) / "worldserve" / "traces"


def unsafe(path: Path) -> str | None:
    """Why TorchScript under ``path`` must not be loaded (another owner, writable by others),
    or None where it is this user's alone. The directory must exist."""
    uid = os.getuid()
    for p in (path, *sorted(path.iterdir())):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            return f"{p} is a symbolic link"
        if st.st_uid != uid:
            return f"{p} is owned by uid {st.st_uid}, not this process's {uid}"
        if st.st_mode & _OTHERS_WRITE:
            return f"{p} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _usable(path: Path) -> str | None:
    try:
        if not path.exists():
            path.mkdir(mode=0o700, parents=True)
        return unsafe(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"


def checked(path: Path | None) -> Path:
    """The directory the trace cache may load from: ``path`` (None: ``default_dir()``)
    where it is this user's alone, else a private one."""
    wanted = path or default_dir()
    why = _usable(wanted)
    if why is None:
        return wanted
    private = Path(tempfile.gettempdir()) / f"worldserve-traces-{os.getuid()}"
    if private != wanted and _usable(private) is None:
        log.warning("trace cache: not loading from %s (%s); using %s", wanted, why, private)
        return private
    fresh = Path(tempfile.mkdtemp(prefix="worldserve-traces-"))
    log.warning("trace cache: not loading from %s (%s); using a fresh %s", wanted, why, fresh)
    return fresh
