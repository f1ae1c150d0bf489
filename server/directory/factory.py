"""``open_directory(url)``: the directory a URL names.

``None`` or ``memory://`` gives the embedded ``MemoryDirectory``; ``redis://``, ``rediss://``
and ``unix://`` give a ``RedisDirectory``. Opening does not connect: the first operation
does, and raises ``DirectoryUnavailable`` if it cannot.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from server.directory.base import Clock, Directory
from server.directory.memory import MemoryDirectory

REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_directory(
    url: str | None, *, prefix: str = "worldserve", clock: Clock = time.time
) -> Directory:
    if url is None or url == "memory://":
        return MemoryDirectory(clock=clock)
    scheme = urlsplit(url).scheme
    if scheme in REDIS_SCHEMES:
        from server.directory.redis import RedisDirectory  # only Redis deployments pay for it

        return RedisDirectory(url, prefix, clock=clock)
    raise ValueError(
        f"directory URL scheme {scheme!r} is not one of 'memory', {', '.join(map(repr, REDIS_SCHEMES))}"
    )
