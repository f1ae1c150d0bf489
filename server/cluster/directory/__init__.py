"""The session directory shared by workers and a router (DESIGN.md §7).

``open_directory(None)`` is the embedded in-memory one; ``open_directory("redis://...")``
is shared through Redis. See ``base`` for the contract both keep.
"""

from worldserve.server.cluster.directory.base import (
    Directory,
    NoWorkerAvailable,
    SessionRecord,
    SessionState,
    UnknownSession,
    UnknownWorker,
    WorkerInfo,
    WorkerState,
)
from worldserve.server.cluster.directory.factory import open_directory
from worldserve.server.cluster.directory.memory import MemoryDirectory
from worldserve.server.remote import (
    HANDOVER_TTL_S,
    ORPHAN_TTL_S,
    DirectoryError,
    DirectoryUnavailable,
)

__all__ = [
    "HANDOVER_TTL_S",
    "ORPHAN_TTL_S",
    "Directory",
    "DirectoryError",
    "DirectoryUnavailable",
    "MemoryDirectory",
    "NoWorkerAvailable",
    "SessionRecord",
    "SessionState",
    "UnknownSession",
    "UnknownWorker",
    "WorkerInfo",
    "WorkerState",
    "open_directory",
]
