"""Small builders shared by the directory tests."""

from __future__ import annotations

from worldserve.server.cluster.directory import Directory, WorkerInfo, WorkerState

LONG_TTL = 30.0


async def add_worker(
    d: Directory,
    worker_id: str,
    *,
    capacity: int = 4,
    state: WorkerState = WorkerState.SERVING,
    load: int = 0,
    utilisation: float = 0.0,
    ttl_s: float = LONG_TTL,
) -> WorkerInfo:
    info = WorkerInfo(
        worker_id,
        f"http://{worker_id}.test:8000",
        state=state,
        capacity=capacity,
        load=load,
        utilisation=utilisation,
    )
    await d.register_worker(info, ttl_s)
    return info
