"""``open_directory(url)``: the directory a URL names.

``None`` or ``memory://`` gives the embedded ``MemoryDirectory``; ``redis://``, ``rediss://``
and ``unix://`` give a ``RedisDirectory``. Opening does not connect: the first operation
does, and raises ``DirectoryUnavailable`` if it cannot. ``orphan_ttl_s``: how long the
record of a session whose worker is gone is kept; ``handover_ttl_s``: how long a
handed-over session holds its target's slot before its client resumes there
(server/remote.py).
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from worldserve.server.cluster.directory.base import Clock, Directory
from worldserve.server.cluster.directory.memory import MemoryDirectory
from worldserve.server.remote import HANDOVER_TTL_S, ORPHAN_TTL_S

REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_directory(
    url: str | None,
    *,
    prefix: str = "worldserve",
    clock: Clock = time.time,
    orphan_ttl_s: float = ORPHAN_TTL_S,
    handover_ttl_s: float = HANDOVER_TTL_S,
) -> Directory:
    if url is None or url == "memory://":
        return MemoryDirectory(clock=clock, orphan_ttl_s=orphan_ttl_s,
                               handover_ttl_s=handover_ttl_s)
    scheme = urlsplit(url).scheme
    if scheme in REDIS_SCHEMES:
        from worldserve.server.cluster.directory.redis import (
            RedisDirectory,  # only Redis deployments pay for it
        )

        return RedisDirectory(url, prefix, clock=clock, orphan_ttl_s=orphan_ttl_s,
                              handover_ttl_s=handover_ttl_s)
    raise ValueError(
        f"directory URL scheme {scheme!r} is not one of 'memory', {', '.join(map(repr, REDIS_SCHEMES))}"
    )
