"""Prometheus metrics, in base units, on a registry owned by one app (no module globals):
``Metrics`` for a worker, ``RouterMetrics`` for a router.

Counters and histograms are updated where things happen; the session gauges (by state and
by degradation level) are read from the service at scrape time, so they never drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Seconds: from 1 ms to 10 s, denser where frames live (10-200 ms).
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
            2.5, 5.0, 10.0)
_TTFF = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"  # what render() returns

SessionCounts = Callable[[], tuple[Mapping[str, int], Mapping[int, int]]]  # by state, by level


class _SessionCollector(Collector):
    def __init__(self, counts: SessionCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        by_state, by_level = self._counts()
        states = GaugeMetricFamily(
            "worldserve_sessions", "Sessions held, by state", labels=["state"]
        )
        for state, n in sorted(by_state.items()):
            states.add_metric([state], n)
        levels = GaugeMetricFamily(
            "worldserve_sessions_by_level",
            "Scheduled sessions by degradation level (0 = as asked)",
            labels=["level"],
        )
        for level, n in sorted(by_level.items()):
            levels.add_metric([str(level)], n)
        return [states, levels]


class Metrics:
    """Every metric of one server; ``render()`` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        # process_resident_memory_bytes, cpu seconds, open fds (Linux /proc; soak tests)
        ProcessCollector(registry=r)
        self.frame_latency = Histogram(
            "worldserve_frame_latency_seconds",
            "From a block being generated to its frame being sent",
            ["codec"], buckets=_LATENCY, registry=r,
        )
        self.step_latency = Histogram(
            "worldserve_step_seconds",
            "Model time of one batch (all denoising steps, commit and decode)",
            ["bucket"], buckets=_LATENCY, registry=r,
        )
        self.plan_latency = Histogram(
            "worldserve_plan_seconds", "Wall time of one engine step (a whole plan)",
            buckets=_LATENCY, registry=r,
        )
        self.encode_latency = Histogram(
            "worldserve_encode_seconds", "Encoding one frame", ["codec"],
            buckets=_LATENCY, registry=r,
        )
        self.ttff = Histogram(
            "worldserve_time_to_first_frame_seconds",
            "From a start message to the session's first frame being sent",
            buckets=_TTFF, registry=r,
        )
        self.batch_size = Histogram(
            "worldserve_batch_size", "Chunks per batch", buckets=(1, 2, 3, 4, 6, 8, 12, 16),
            registry=r,
        )
        self.deadline_misses = Counter(
            "worldserve_deadline_misses", "Blocks finished after their deadline", ["mode"],
            registry=r,
        )
        self.drops = Counter(
            "worldserve_frames_dropped",
            "Frames not shown, by reason: skipped (not generated in time), slow_client "
            "(replaced in the transport's holder before it was sent)",
            ["reason"], registry=r,
        )
        self.frames_sent = Counter(
            "worldserve_frames_sent", "Frames sent", ["codec"], registry=r
        )
        self.bytes_sent = Counter(
            "worldserve_frame_bytes_sent", "Frame payload bytes sent", ["codec"], registry=r
        )
        self.messages = Counter(
            "worldserve_messages_received", "Client messages received, by type", ["type"],
            registry=r,
        )
        self.errors = Counter(
            "worldserve_errors_sent", "Error messages sent, by code", ["code"], registry=r
        )
        self.actions = Counter(
            "worldserve_actions",
            "Client actions by result: applied, coalesced (replaced before applying), stale",
            ["result"], registry=r,
        )
        self.prompts_refused = Counter(
            "worldserve_prompts_refused", "Prompts the prompt filter refused, by where: start, switch",
            ["where"], registry=r,
        )
        for where in ("start", "switch"):  # both series from the start, at 0
            self.prompts_refused.labels(where)
        self.sessions_started = Counter(
            "worldserve_sessions_started", "Sessions opened", ["mode"], registry=r
        )
        self.sessions_ended = Counter(
            "worldserve_sessions_ended", "Sessions ended, by reason", ["reason"], registry=r
        )
        self.resumes = Counter(
            "worldserve_resumes", "Resume attempts, by result", ["result"], registry=r
        )
        self.degradations = Counter(
            "worldserve_degradation_changes", "Ladder moves, by direction", ["direction"],
            registry=r,
        )
        self.runner_errors = Counter(
            "worldserve_runner_errors", "Per-session runner failures", registry=r
        )
        self.cost_drift = Counter(
            "worldserve_cost_drift", "Batches whose time strayed from the cost model", registry=r
        )
        self.utilisation = Gauge(
            "worldserve_predicted_utilisation", "Predicted model utilisation (1 = always busy)",
            registry=r,
        )
        self.migrations = Counter(
            "worldserve_migrations",
            "Sessions moved between workers: handed_off (sent away by a drain), adopted "
            "(taken in from a handoff), restored (resumed from one), failed",
            ["result"], registry=r,
        )
        self.snapshots = Counter(
            "worldserve_snapshots", "Checkpoints written to the directory (or the embedded server's store), by result",
            ["result"], registry=r,
        )
        self.directory_up = Gauge(
            "worldserve_directory_up", "1 while the session directory answers, else 0", registry=r
        )
        self.connections = Gauge(
            "worldserve_websocket_connections", "Open WebSocket connections", registry=r
        )

    def track_sessions(self, counts: SessionCounts) -> None:
        """Report session gauges from ``counts`` at every scrape."""
        self.registry.register(_SessionCollector(counts))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RouterMetrics:
    """Every metric of one router (server/cluster/router.py); ``render()`` is its /metrics body.

    Counters move where things happen; the worker gauges are set from the directory at
    every scrape (``Router.scrape``) and are absent while it does not answer."""

    PLACEMENTS = ("placed", "refused", "failed")
    RESUMES = ("found", "re_placed", "missing", "refused", "failed", "bad_request")

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        self.placements = Counter(
            "worldserve_router_placements",
            "Placement requests (POST /v1/place) by outcome: placed, refused (no worker had "
            "room), failed (the directory failed)",
            ["outcome"], registry=r,
        )
        self.resumes = Counter(
            "worldserve_router_resumes",
            "Resume lookups (POST /v1/resume) by outcome: found (on the worker that holds "
            "it), re_placed (its worker died: placed on a live one to restore it), missing "
            "(unknown, or no snapshot to restore from), refused (no worker had room), failed "
            "(the directory failed), bad_request",
            ["outcome"], registry=r,
        )
        self.requests = Counter(
            "worldserve_router_requests",
            "Signaling requests answered (/v1/place, /v1/resume, /v1/workers), by endpoint "
            "and HTTP status",
            ["endpoint", "status"], registry=r,
        )
        self.directory_errors = Counter(
            "worldserve_router_directory_errors",
            "Directory calls that failed (unreachable, or a record that does not parse), by "
            "operation",
            ["operation"], registry=r,
        )
        self.directory_up = Gauge(
            "worldserve_router_directory_up",
            "1 if the session directory answered at the last scrape, else 0", registry=r,
        )
        self.workers = Gauge(
            "worldserve_router_workers",
            "Live workers in the directory at the last scrape, by state",
            ["state"], registry=r,
        )
        for outcome in self.PLACEMENTS:  # every outcome is reported from the start, at 0
            self.placements.labels(outcome)
        for outcome in self.RESUMES:
            self.resumes.labels(outcome)

    def render(self) -> bytes:
        return generate_latest(self.registry)
