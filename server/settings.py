"""Server settings: frozen dataclasses, validated, with the help text of every field.

Each field is one setting under one name: ``worker_ttl_s`` is the flag ``--worker-ttl-s``
and the environment variable ``WORLDSERVE_WORKER_TTL_S``; the WebRTC settings (``rtc``)
are ``--rtc-codecs`` / ``WORLDSERVE_RTC_CODECS`` and so on. server/flags.py makes the
flags and reads the variables from these fields; docs/operations.md lists them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from worldserve.server.remote import HANDOVER_TTL_S, ORPHAN_TTL_S
from worldserve.session.admission import AdmissionOptions
from worldserve.session.options import SchedulerOptions

DTYPES = ("float32", "bfloat16", "auto")  # model/dtype.py
CANVAS_DECODE = ("auto", "between", "beside")  # model/default/reference/canvas/tile_decode.py

T = TypeVar("T")
VideoCodecName = Literal["H264", "VP8"]
Loopback = Literal["auto", "always", "never"]


def setting(default: T, help: str) -> T:
    """A settings field: its default and the help text its flag shows."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class IceServer:
    """A STUN or TURN server (``urls`` like ``stun:host:3478`` or ``turn:host:3478``)."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        if not self.urls or not all(
            isinstance(u, str) and u.split(":", 1)[0] in ("stun", "stuns", "turn", "turns")
            for u in self.urls
        ):
            raise ValueError(f"bad setting: ice server urls {self.urls!r} must be stun:/turn: URLs")


@dataclass(frozen=True, slots=True)
class RtcSettings:
    """The WebRTC transport's settings (server/rtc/), ``Settings.rtc``."""

    enabled: bool = setting(True, "WebRTC offers; off: /v1/rtc/offer answers 404 and the page "
                                  "falls back to the WebSocket")
    # No STUN/TURN by default: on loopback and LANs host candidates are enough, and an
    # empty list keeps aiortc from looking up a public STUN server.
    ice_servers: tuple[IceServer, ...] = setting((), "STUN/TURN servers as JSON, e.g. "
                                                 '[{"urls": ["turn:host:3478"], "username": "u", '
                                                 '"credential": "p"}]; set them behind NAT')
    # aioice never offers 127.0.0.1; on a box whose only interface is loopback nothing
    # connects. (The workaround is tied to aioice 0.13, pinned in pyproject.toml.)
    loopback_candidates: Loopback = setting("auto", "offer 127.0.0.1 as a host candidate: auto "
                                                    "(only on a loopback-only box), always or never")
    # H.264 first: x264 ultrafast+zerolatency encodes 3-5x faster than VP8 at 64-128 px
    # (python -m bench.latency prints the table).
    codecs: tuple[VideoCodecName, ...] = setting(("H264", "VP8"), "video codecs offered, in order "
                                                                  "(the first the client has is used)")
    # Congestion feedback (REMB) moves the bitrate between target/4 and target*3, inside the clamp.
    bits_per_pixel: float = setting(1.0, "target video bitrate in bits per pixel per frame")
    min_bitrate: int = setting(64_000, "lowest video bitrate, bits per second")
    max_bitrate: int = setting(4_000_000, "highest video bitrate, bits per second")
    keyframe_interval_s: float = setting(10.0, "a keyframe at least this often, seconds (and on PLI)")
    connect_timeout_s: float = setting(15.0, "an offer whose peer does not connect by then is "
                                             "dropped, seconds")
    max_offer_bytes: int = setting(64 * 1024, "size limit of an offer's POST body, bytes")
    control_buffer_bytes: int = setting(256 * 1024, "control data queued in SCTP before the "
                                                    "server holds back, bytes")
    close_flush_s: float = setting(0.2, "after ended, wait this long for it to leave, then "
                                        "close, seconds")

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"bad setting: {what}")

        need(self.loopback_candidates in ("auto", "always", "never"),
             f"loopback_candidates {self.loopback_candidates!r} is auto, always or never")
        need(len(self.codecs) > 0 and all(c in ("H264", "VP8") for c in self.codecs),
             f"codecs {self.codecs!r} must be a non-empty subset of H264, VP8")
        need(math.isfinite(self.bits_per_pixel) and self.bits_per_pixel > 0,
             f"bits_per_pixel {self.bits_per_pixel!r} must be finite and > 0")
        need(0 < self.min_bitrate <= self.max_bitrate,
             f"need 0 < min_bitrate {self.min_bitrate!r} <= max_bitrate {self.max_bitrate!r}")
        for name in ("keyframe_interval_s", "connect_timeout_s", "close_flush_s"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, f"{name} {v!r} must be finite and > 0")
        need(self.max_offer_bytes >= 4096, f"max_offer_bytes {self.max_offer_bytes!r} must be >= 4096")
        need(self.control_buffer_bytes >= 4096,
             f"control_buffer_bytes {self.control_buffer_bytes!r} must be >= 4096")


@dataclass(frozen=True, slots=True)
class Settings:
    # --- where ---
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "TCP port to listen on")
    # --- the model ---
    model: str = setting("default", "model family (model/registry.py): default (the embedded "
                                    "model), wan-causal or matrix-game-2 (docs/model-families.md)")
    weights: Path | None = setting(None, "model weights: default, a .safetensors with its .json "
                                         "(default: the shipped ones); wan-causal, a directory")
    sizes: tuple[tuple[int, int], ...] | None = setting(
        None, "frame sizes a latent model serves, HxW[,HxW] (wan-causal: 480x832; default: its own)")
    recipe: str | None = setting(None, "a published Wan checkpoint's inference settings by name "
                                       "(model/wan/recipes.py: self-forcing, causvid, longlive, ...); "
                                       "a config.json beside the checkpoint overrides them")
    vae: str = setting("full", "what decodes a Wan model's latents: full (the Wan2.1 VAE), tae (TAEHV, "
                               "taew2_1.pth in --weights; docs/model-families.md) or a path to that file")
    # 1 by default: on a small shared CPU two threads can run 30x slower than one under
    # contention.
    threads: int | None = setting(1, "torch threads of the model thread (empty: torch's default)")
    # bf16 costs ~0.1-0.25 dB PSNR (bench/quality.py --dtype).
    dtype: str = setting("auto", "the model's float type: auto (bf16 where the CPU has bf16 matrix "
                                 "instructions, AVX-512 BF16 or AMX; fp32 elsewhere), float32 (what "
                                 "the model was trained in) or bfloat16")
    device: str = setting("cpu", "cpu, cuda or cuda:N: where the model runs")
    cuda_graphs: bool = setting(True, "on a GPU, replay chunks as CUDA graphs")
    trace_cache: bool = setting(True, "keep the CPU chunk traces between starts, so a restarted worker "
                                      "loads them instead of recording them (keyed by model, code and torch)")
    trace_cache_dir: Path | None = setting(None, "where the trace cache lives; empty: "
                                                 "$XDG_CACHE_HOME/worldserve/traces (~/.cache/worldserve/traces)")
    cpu_trace: bool = setting(True, "on the CPU, run the default model's chunks as TorchScript traces: "
                                    "no Python between kernels, the GIL released while they run")
    canvas: bool = setting(True, "the default model: keep a world canvas per session (ground codes in world "
                                 "coordinates, model/default/reference/canvas/) and take every frame's reference "
                                 "from it; --no-canvas: the anchor of the model's own frames, as before")
    canvas_decode: str = setting("auto", "where the canvas's tiles decode ahead of the camera: between the "
                                         "model's chunks, beside them (on the core the model thread leaves "
                                         "free), or auto: beside where a start-up probe finds the cores "
                                         "computing side by side (CPU only)")
    canvas_trust: float = setting(4.0, "the default model on its canvas: logits added to its head's reference "
                                       "mix, so it copies more of the canvas's ground and draws less of its own "
                                       "(0: as the weights learnt; docs/default-model.md)")
    canvas_sharpen: float = setting(1.0, "the default model on its canvas: the unsharp mask's amount on each "
                                         "decoded tile, which the decoder draws softer than the world's ground "
                                         "(0: as drawn; docs/default-model.md)")
    canvas_live: bool = setting(False, "the default model on its canvas: keep what moves (herds, boats, clouds, fog) "
                                       "in each session's live state and let the model draw it "
                                       "(model/default/reference/live/, docs/default-model.md)")
    buckets: tuple[int, ...] | None = setting(None, "buckets served, e.g. 64,128 (a subset of the "
                                                    "model's; empty: all)")
    warmup_batch_sizes: tuple[int, ...] = setting((1, 2, 4, 8), "batch sizes warmed up and batched at; "
                                                  "the default model runs a batch as the smallest of them "
                                                  "that holds it (each costs a recording per shape)")
    warmup_steps: tuple[int, ...] | None = setting(None, "denoising step counts to warm (empty: the "
                                                         "ladder's, min_steps..max steps)")
    # --- sessions ---
    capacity: int = setting(8, "sessions held at once, active and detached")
    detached_ttl_s: float = setting(30.0, "seconds a dropped session stays resumable")
    idle_timeout_s: float = setting(300.0, "an attached session whose client sends nothing this long "
                                           "is ended (idle); 0: never")
    max_session_age_s: float = setting(86400.0, "a session is ended (max_age) this long after it "
                                                "opened on this worker; 0: never")
    max_token_age_s: float = setting(86400.0, "a resume token older than this is refused (each resume "
                                              "gives a new one), seconds")
    quota_starts_per_s: float = setting(5.0, "starts a client (address, and API key) may make per second")
    quota_start_burst: int = setting(20, "starts a client may make at once")
    quota_sessions: int = setting(32, "sessions a client (address, and API key) may hold here; 0: no limit")
    replay_blocks: int = setting(16, "recent blocks kept per session, re-sent on resume")
    log_capacity: int = setting(1024, "events kept in a session's replay log (worldserve "
                                      "replay; changes only), 1-65536")
    log_frame_bytes: int = setting(32 * 2**20, "bytes of observation frames a session's replay log "
                                               "keeps (older ones as digests only)")
    # --- scheduler knobs (session/options.py SchedulerOptions) ---
    batching: bool = setting(True, "batch the sessions whose deadlines line up (off: step each alone)")
    batch_window_s: float = setting(0.010, "sessions due within this many seconds share a batch")
    release_ahead: float = setting(1.0, "chunk periods before its deadline a chunk may start")
    min_steps: int = setting(2, "fewest denoising steps the degradation ladder goes down to")
    min_fps: float = setting(12.0, "lowest frame rate the degradation ladder goes down to")
    pull_deadline_s: float = setting(0.25, "a pull-mode block's default deadline, seconds")
    pull_queue: int = setting(8, "outstanding block requests per pull session")
    admission_threshold: float = setting(0.85, "admit a session only while predicted utilisation "
                                               "stays below this")
    admission_retry_after_s: float = setting(5.0, "the retry_after a refused session is told, seconds")
    # --- defaults and limits per connection ---
    jpeg_quality: int = setting(80, "JPEG quality of WebSocket frames, 1-95")
    api_keys: frozenset[str] = setting(frozenset(), "API keys for session creation, comma-separated "
                                                    "(empty: no key needed)")
    max_msg_size: int = setting(1 << 20, "bytes per inbound message; a larger one closes with 1009")
    max_msgs_per_s: float = setting(400.0, "inbound messages per second per connection (burst: "
                                           "msg_burst)")
    msg_burst: int = setting(200, "inbound messages a connection may send at once")
    max_actions_per_s: float = setting(120.0, "actions applied per second; faster ones coalesce "
                                              "(newest wins)")
    action_burst: int = setting(30, "actions a connection may send at once")
    input_burst: int = setting(2, "prompts, observations and new epochs (pull block 0) a session may "
                                  "send at once; then one per chunk period (docs/protocol.md)")
    send_queue: int = setting(16, "ordered frames (pull, replays) waiting per connection")
    control_queue: int = setting(64, "control messages waiting per connection; the oldest is dropped")
    status_interval_s: float = setting(1.0, "seconds between status messages")
    heartbeat_s: float = setting(15.0, "WebSocket ping interval, seconds (detects dead peers)")
    close_timeout_s: float = setting(5.0, "a closing connection that does not drain is aborted "
                                          "after this, seconds")
    max_image_pixels: int = setting(1024 * 1024, "observations larger than this are refused, pixels")
    # --- the prompt filter (server/prompt_filter.py) ---
    prompt_blocklist: Path | None = setting(None, "a file of words and re: patterns a prompt may not contain, one a "
                                                  "line (# comments); read at start-up")
    prompt_filter: str | None = setting(None, "module:callable: the operator's prompt check, called with the prompt's "
                                              "text, returns None to allow it or a short reason to refuse it")
    prompt_filter_timeout_s: float = setting(2.0, "a prompt whose --prompt-filter check takes longer is refused "
                                                  "(filter timed out), seconds")
    log_refused_prompts: bool = setting(False, "log a refused prompt's text (off: only where, the session and why)")
    # --- WebRTC ---
    rtc: RtcSettings = setting(RtcSettings(), "the WebRTC transport (server/rtc/)")
    # --- what outlives a process (server/store/; docs/operations.md) ---
    store: str | None = setting(None, "where saved worlds and crash checkpoints are kept: a directory or an "
                                      "fsspec URL (s3://bucket/prefix); auto: $XDG_DATA_HOME/worldserve/store "
                                      "where writable (worldserve serve's default); none or empty: off")
    # --- scale-out (DESIGN.md §7; docs/operations.md) ---
    directory_url: str | None = setting(None, "shared session directory, e.g. redis://127.0.0.1:6379/0 "
                                              "(empty: the embedded single worker, in memory)")
    directory_prefix: str = setting("worldserve", "key prefix in the directory: one per deployment")
    advertise: str | None = setting(None, "http base URL others reach this worker at (empty: "
                                          "http://HOST:PORT)")
    worker_id: str | None = setting(None, "this worker's id (empty: derived from the advertised address)")
    cluster_secret: str | None = setting(None, "the secret every worker signs and checks hand-offs and "
                                               "its directory record with (HMAC; set it via "
                                               "WORLDSERVE_CLUSTER_SECRET)")
    allowed_workers: frozenset[str] = setting(frozenset(), "hosts (host or host:port) a draining worker "
                                                           "may migrate sessions to, comma-separated (empty: any)")
    allowed_origins: frozenset[str] = setting(frozenset(), "Origin headers a browser's WebSocket may come "
                                                           "from, e.g. https://play.example (empty: any)")
    admin_key: str | None = setting(None, "bearer key of POST /admin/drain (empty: the admin API is off)")
    worker_heartbeat_s: float = setting(1.0, "seconds between directory heartbeats")
    worker_ttl_s: float = setting(5.0, "seconds without a heartbeat before a worker counts as dead")
    snapshot_interval_s: float = setting(2.0, "seconds between crash-recovery checkpoints of each "
                                              "session (0: off)")
    snapshot_ttl_s: float = setting(600.0, "seconds checkpoints and handoffs last in the directory")
    orphan_ttl_s: float = setting(ORPHAN_TTL_S, "seconds the directory keeps the record of a session "
                                                "whose worker is gone (>= snapshot_ttl_s: it must "
                                                "outlive the checkpoint); give the routers the same")
    handover_ttl_s: float = setting(HANDOVER_TTL_S, "seconds a session handed over by a drain holds "
                                                    "its target's slot waiting for its client (<= "
                                                    "snapshot_ttl_s); give the routers the same")
    drain_timeout_s: float = setting(30.0, "a drain ends the sessions not handed over by then, seconds")
    placement_threshold: float = setting(0.9, "a drain moves sessions only to workers below this "
                                              "utilisation")
    migrate_replay_blocks: int = setting(8, "recent blocks carried by a migration handoff, 0-64")
    # --- logs ---
    log_format: Literal["kv", "json"] = setting("kv", "log lines as key=value or JSON")
    log_level: str = setting("INFO", "log level: DEBUG, INFO, WARNING, ERROR")

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"bad setting: {what}")

        need(0 <= self.port <= 65535, f"port {self.port!r} must be in [0, 65535]")
        need(self.threads is None or self.threads >= 1, f"threads {self.threads!r} must be >= 1")
        need(self.dtype in DTYPES, f"dtype {self.dtype!r} must be one of {DTYPES}")
        need(0 <= self.canvas_trust < float("inf"), f"canvas_trust {self.canvas_trust} must be a finite number >= 0")
        need(0 <= self.canvas_sharpen < float("inf"),
             f"canvas_sharpen {self.canvas_sharpen} must be a finite number >= 0")
        need(self.canvas_decode in CANVAS_DECODE,
             f"canvas_decode {self.canvas_decode!r} must be one of {CANVAS_DECODE}")
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
                     "drain_timeout_s", "placement_threshold", "prompt_filter_timeout_s"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, f"{name} {v!r} must be finite and > 0")
        need(self.replay_blocks >= 1, f"replay_blocks {self.replay_blocks!r} must be >= 1")
        need(self.log_frame_bytes >= 0, f"log_frame_bytes {self.log_frame_bytes!r} must be >= 0")
        need(1 <= self.log_capacity <= 65536, f"log_capacity {self.log_capacity!r} must be in [1, 65536]")
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
        need(self.max_token_age_s > 0, f"max_token_age_s {self.max_token_age_s!r} must be > 0")
        for name in ("idle_timeout_s", "max_session_age_s"):
            need(math.isfinite(getattr(self, name)) and getattr(self, name) >= 0, f"{name} must be finite and >= 0")
        need(self.quota_sessions >= 0, f"quota_sessions {self.quota_sessions!r} must be >= 0")
        for name in ("max_msgs_per_s", "max_actions_per_s", "quota_starts_per_s"):
            v = getattr(self, name)
            need(math.isfinite(v) and v > 0, f"{name} {v!r} must be finite and > 0")
        for name in ("msg_burst", "action_burst", "input_burst", "quota_start_burst", "send_queue", "control_queue",
                     "pull_queue"):
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
