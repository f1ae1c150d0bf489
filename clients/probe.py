"""One scripted session, recorded: what the soak tester and the migration drill measure.

A ``Probe`` drives a ``WorldClient`` with a deterministic action script (a new action
every ``action_period_s``, the same for the same ``index``) and records every frame's
arrival (monotonic clock), block_idx and applied action seq, the time from each action to
the first frame that used it, skips, status counters, errors, and the migration events
(``migrate`` received, ``resumed`` replies with their gap report).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from worldserve.clients.sdk import FrameEvent, SessionEnded, WorldClient
from worldserve.protocol import ACTION_DIM, Error, Migrate, Resumed, Skipped, Status, encode_action

_KEYS: tuple[tuple[str, ...], ...] = (
    ("forward",), ("forward", "left"), ("right",), (), ("back",), ("forward", "right"), ("left",),
)


def scripted_action(index: int, k: int) -> tuple[tuple[str, ...], tuple[float, float]]:
    """Action ``k`` of session ``index``: keys from a cycle, a smooth small mouse delta."""
    keys = _KEYS[(k + index) % len(_KEYS)]
    phase = 0.7 * k + index
    return keys, (round(0.3 * math.sin(phase), 3), round(0.3 * math.cos(phase), 3))


@dataclass(slots=True)
class Received:
    block_idx: int
    t: float  # monotonic arrival time
    action_seq: int
    url: str  # the worker that sent it
    image: np.ndarray | None = None


@dataclass
class Probe:
    client: WorldClient
    index: int
    action_period_s: float = 0.5
    keep_images: bool = False
    pull: bool = False  # pull mode: ask for the next block as each one arrives
    frames: list[Received] = field(default_factory=list)
    actions: dict[int, tuple[tuple[str, ...], tuple[float, float], float]] = field(default_factory=dict)
    action_latency: list[float] = field(default_factory=list)
    skipped_frames: int = 0
    status_drops: dict[str, int] = field(default_factory=dict)  # per worker url: last counter
    status_misses: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    migrates: list[tuple[float, Migrate]] = field(default_factory=list)
    resumes: list[tuple[float, Resumed]] = field(default_factory=list)
    ended: str | None = None
    _unmatched: list[int] = field(default_factory=list)

    async def run(self, until: Callable[[], bool], *, timeout: float = 30.0) -> None:
        """Read events and send scripted actions until ``until()`` or the session ends."""
        actor = asyncio.create_task(self._act(until))
        try:
            while not until():
                try:
                    ev = await self.client.recv(timeout)
                except SessionEnded:
                    self.ended = repr(self.client.ended)
                    return
                except TimeoutError:
                    self.errors.append(f"no event for {timeout:g} s")
                    return
                self.on_event(ev, time.monotonic())
                if self.pull and isinstance(ev, FrameEvent):
                    await self.client.request()
        finally:
            actor.cancel()
            try:
                await actor
            except (asyncio.CancelledError, SessionEnded):
                pass

    def on_event(self, ev: object, now: float) -> None:
        url = self.client.url
        if isinstance(ev, FrameEvent):
            seq = ev.msg.action_seq
            self.frames.append(Received(ev.block_idx, now, seq, url, ev.image if self.keep_images else None))
            while self._unmatched and self._unmatched[0] <= seq:
                sent = self.actions[self._unmatched.pop(0)][2]
                self.action_latency.append(now - sent)
        elif isinstance(ev, Skipped):
            self.skipped_frames += ev.frames
        elif isinstance(ev, Status):
            self.status_drops[url] = ev.drops
            self.status_misses[url] = ev.misses
        elif isinstance(ev, Error):
            self.errors.append(f"{ev.code}: {ev.message}")
        elif isinstance(ev, Migrate):
            self.migrates.append((now, ev))
        elif isinstance(ev, Resumed):
            self.resumes.append((now, ev))

    async def _act(self, until: Callable[[], bool]) -> None:
        k = 0
        while not until():
            keys, mouse = scripted_action(self.index, k)
            try:
                seq = await self.client.action(keys, mouse)
            except SessionEnded:
                return
            self.actions[seq] = (keys, mouse, time.monotonic())
            self._unmatched.append(seq)
            k += 1
            await asyncio.sleep(self.action_period_s)

    # --- what it saw ---

    @property
    def blocks(self) -> list[int]:
        return [f.block_idx for f in self.frames]

    def lost_and_duplicated(self) -> tuple[int, int]:
        """Blocks missing from 0..last received, and blocks received more than once."""
        seen = self.blocks
        if not seen:
            return 0, 0
        unique = set(seen)
        return max(unique) + 1 - len(unique), len(seen) - len(unique)

    def intervals(self) -> list[float]:
        t = [f.t for f in self.frames]
        return [b - a for a, b in itertools.pairwise(t)]

    def action_vector(self, seq: int) -> np.ndarray:
        """The action the server applied as ``seq`` (a seq the SDK re-sent on resume
        repeats the newest one before it; 0 is no action)."""
        known = [s for s in self.actions if s <= seq]
        if seq == 0 or not known:
            return np.zeros(ACTION_DIM, np.float32)
        keys, mouse, _ = self.actions[max(known)]
        return encode_action(frozenset(keys), mouse)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")
