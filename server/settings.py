"""Server settings: one frozen dataclass, validated, with a comment per field."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from server.directory.base import HANDOVER_TTL_S, ORPHAN_TTL_S
from session.admission import AdmissionOptions
from session.options import SchedulerOptions

DTYPES = ("float32", "bfloat16", "auto")  # model/dtype.py


@dataclass(frozen=True, slots=True)
class Settings:
    # --- where ---
    host: str = "127.0.0.1"
    port: int = 8000
    # --- the model ---
    model: str = "default"  # model family (model/registry.py): default or wan-causal
    weights: Path | None = None  # default: None is model/weights/default.safetensors; wan-causal: a directory
    sizes: tuple[tuple[int, int], ...] | None = None  # (height, width) a latent family serves; None: its own
    # torch threads of the model thread. 1 by default: on a small shared CPU two threads
    # can run 30x slower than one under contention (None: torch's default).
    threads: int | None = 1
    # the model's float type: auto (bf16 where the CPU has bf16 matrix instructions,
    # AVX-512 BF16 or AMX; fp32 elsewhere), float32 (what the model was trained in), or
    # bfloat16. bf16 costs ~0.1-0.25 dB PSNR (bench/quality.py --dtype).
    dtype: str = "auto"
    device: str = "cpu"  # "cuda" (or "cuda:N") runs the model on a GPU
    cuda_graphs: bool = True  # on a GPU: replay chunks as CUDA graphs (the CPU runs eagerly)
    buckets: tuple[int, ...] | None = None  # buckets served (a subset of the model's); None: all
    warmup_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)  # batch sizes warmed and batched
    warmup_steps: tuple[int, ...] | None = None  # None: the ladder's, min_steps..max steps
    # --- sessions ---
    capacity: int = 8  # sessions held at once, active and detached
    detached_ttl_s: float = 30.0  # a detached session stays resumable this long
    replay_blocks: int = 16  # recent blocks kept per session, re-sent on resume
    # --- scheduler knobs (session/options.py SchedulerOptions) ---
    batching: bool = True
    batch_window_s: float = 0.010
    release_ahead: float = 1.0
    min_steps: int = 2
    min_fps: float = 12.0
    pull_deadline_s: float = 0.25
    pull_queue: int = 8  # outstanding block requests per pull session
    admission_threshold: float = 0.85
    admission_retry_after_s: float = 5.0
    # --- defaults and limits per connection ---
    jpeg_quality: int = 80
    api_keys: frozenset[str] = frozenset()  # non-empty: session creation needs one of them
    max_msg_size: int = 1 << 20  # bytes per inbound message; larger closes with 1009
    max_msgs_per_s: float = 400.0  # inbound messages per second (burst: msg_burst)
    msg_burst: int = 200
    max_actions_per_s: float = 120.0  # actions applied per second; faster ones coalesce
    action_burst: int = 30
    send_queue: int = 16  # ordered frames (pull, replays) waiting per connection
    control_queue: int = 64  # control messages waiting per connection; oldest dropped
    status_interval_s: float = 1.0
    heartbeat_s: float = 15.0  # WebSocket ping interval (detects dead peers)
    close_timeout_s: float = 5.0  # a closing connection that does not drain is aborted
    max_image_pixels: int = 1024 * 1024  # observations larger than this are refused
    # --- scale-out (DESIGN.md §7; docs/operations.md) ---
    # None: the embedded single worker (an in-memory directory); "redis://host:port/db":
    # one of several workers sharing a directory (sessions come through a router).
    directory_url: str | None = None
    directory_prefix: str = "worldserve"  # key prefix in Redis: one per deployment
    advertise: str | None = None  # http base URL others reach this worker at; None: host:port
    worker_id: str | None = None  # None: derived from the advertised address
    admin_key: str | None = None  # bearer key of POST /admin/drain; None: admin API off
    worker_heartbeat_s: float = 1.0  # seconds between directory heartbeats
    worker_ttl_s: float = 5.0  # a worker without a heartbeat this long is dead
    snapshot_interval_s: float = 2.0  # checkpoint every running session this often (0: off)
    snapshot_ttl_s: float = 600.0  # checkpoints and handoffs expire from the directory
    # the directory keeps the record of a session whose worker is gone this long (>= the
    # snapshot TTL: the record must outlive the checkpoint it is resumed from)
    orphan_ttl_s: float = ORPHAN_TTL_S
    # a session this worker hands over holds its target's slot this long at most before its
    # client resumes there; then it is orphaned (resumable through the router while its
    # handoff lasts: <= the snapshot TTL)
    handover_ttl_s: float = HANDOVER_TTL_S
    drain_timeout_s: float = 30.0  # a drain ends the sessions not handed over by then
    placement_threshold: float = 0.9  # a drain's target must have utilisation below this
    migrate_replay_blocks: int = 8  # recent blocks carried by a migration handoff
    # --- logs ---
    log_format: Literal["kv", "json"] = "kv"
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"bad setting: {what}")

        need(0 <= self.port <= 65535, f"port {self.port!r} must be in [0, 65535]")
        need(self.threads is None or self.threads >= 1, f"threads {self.threads!r} must be >= 1")
        need(self.dtype in DTYPES, f"dtype {self.dtype!r} must be one of {DTYPES}")
        need(re.fullmatch(r"cpu|cuda(:\d+)?", self.device) is not None,
             f"device {self.device!r} must be cpu, cuda or cuda:N")
        need(self.buckets is None or len(self.buckets) > 0, "buckets must not be empty")
        need(re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.model) is not None, f"model {self.model!r} is not a model name")
        need(self.sizes is None or (len(self.sizes) > 0 and all(h >= 1 and w >= 1 for h, w in self.sizes)),
             f"sizes {self.sizes!r} must be (height, width) pairs of ints >= 1")
        need(
            len(self.warmup_batch_sizes) > 0 and min(self.warmup_batch_sizes) >= 1,
            f"warmup_batch_sizes {self.warmup_batch_sizes!r} must be ints >= 1",
        )
        need(
            self.warmup_steps is None or (len(self.warmup_steps) > 0 and min(self.warmup_steps) >= 1),
            f"warmup_steps {self.warmup_steps!r} must be ints >= 1",
        )
        need(self.capacity >= 1, f"capacity {self.capacity!r} must be >= 1")
        for name in ("detached_ttl_s", "pull_deadline_s", "status_interval_s", "heartbeat_s",
                     "close_timeout_s", "admission_retry_after_s", "worker_heartbeat_s",
                     "worker_ttl_s", "snapshot_ttl_s", "orphan_ttl_s", "handover_ttl_s",
                     "drain_timeout_s", "placement_threshold"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, f"{name} {v!r} must be finite and > 0")
        need(self.replay_blocks >= 1, f"replay_blocks {self.replay_blocks!r} must be >= 1")
        need(0 <= self.migrate_replay_blocks <= 64,
             f"migrate_replay_blocks {self.migrate_replay_blocks!r} must be in [0, 64]")
        need(math.isfinite(self.snapshot_interval_s) and self.snapshot_interval_s >= 0,
             f"snapshot_interval_s {self.snapshot_interval_s!r} must be finite and >= 0")
        need(self.worker_ttl_s > self.worker_heartbeat_s,
             f"worker_ttl_s {self.worker_ttl_s!r} must exceed worker_heartbeat_s "
             f"{self.worker_heartbeat_s!r}")
        need(self.orphan_ttl_s >= self.snapshot_ttl_s,
             f"orphan_ttl_s {self.orphan_ttl_s!r} must be >= snapshot_ttl_s "
             f"{self.snapshot_ttl_s!r}: an orphaned session's record must outlive its checkpoint")
        need(self.handover_ttl_s <= self.snapshot_ttl_s,
             f"handover_ttl_s {self.handover_ttl_s!r} must be <= snapshot_ttl_s "
             f"{self.snapshot_ttl_s!r}: past its handoff a target has nothing to restore")
        need(self.admin_key is None or len(self.admin_key) >= 8, "admin_key must be >= 8 chars")
        need(1 <= self.jpeg_quality <= 95, f"jpeg_quality {self.jpeg_quality!r} must be in [1, 95]")
        need(self.max_msg_size >= 1024, f"max_msg_size {self.max_msg_size!r} must be >= 1024")
        for name in ("max_msgs_per_s", "max_actions_per_s"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, f"{name} {v!r} must be finite and > 0")
        for name in ("msg_burst", "action_burst", "send_queue", "control_queue", "pull_queue"):
            need(getattr(self, name) >= 1, f"{name} {getattr(self, name)!r} must be >= 1")
        need(self.log_format in ("kv", "json"), f"log_format {self.log_format!r} is kv or json")
        need(all(isinstance(k, str) and k for k in self.api_keys), "api keys must be non-empty")
        self.scheduler_options()  # their own checks

    def scheduler_options(self) -> SchedulerOptions:
        return SchedulerOptions(
            batch_window=self.batch_window_s,
            release_ahead=self.release_ahead,
            pull_deadline=self.pull_deadline_s,
            pull_queue=self.pull_queue,
            min_steps=self.min_steps,
            min_fps=self.min_fps,
            batching=self.batching,
            admission=AdmissionOptions(self.admission_threshold, self.admission_retry_after_s),
        )
