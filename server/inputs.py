"""Client inputs to a live session: actions, prompts, observations and pull-mode block
requests (what server/dispatch.py hands the service for both transports).

- ``action``: the newest controls win. An action whose seq is not newer than the last one
  seen is dropped (``stale``); faster than ``max_actions_per_s`` actions coalesce into one
  pending action, applied when the token bucket allows (``coalesced``). The applied action
  is kept on the ``Live`` so that a resume (here or on another worker) applies it again.
- ``prompt`` and ``observe`` change the session's scene or commit a real frame; both are
  acknowledged (``ack``). A prompt is screened first (server/prompt_filter.py): a refused
  one is a ``prompt_refused`` error and the session keeps its prompt. An observation's
  image is decoded on the codec pool (server/offload.py), off the loop; the session is
  looked up again once it is decoded (a prompt's, once the filter has run).
- An input of a kind the model does not take (``keys``, ``mouse``, ``prompt``,
  ``observation`` missing from ``started.controls``) is handled like any other (an action
  still counts in ``action_seq``, a prompt or observation is still acknowledged) and changes
  nothing the model draws; the first of each kind on a connection gets one non-fatal
  ``ignored_control`` error whose ``field`` names the kind.
- ``block``: pull mode's block requests, under the store's block_idx rules (next, a
  retransmit of the last, or 0 for a new epoch) and at most ``pull_queue`` outstanding
  (requested, not yet generated; ``start``'s block 0 counts). The scheduler starts them
  no faster than the session's admitted fps (session/scheduler.py).

A hand-off (server/cluster/migration.py) takes the session out of the engine between two steps
while its client stays attached until ``migrate``. Inputs that arrive meanwhile update the
session (store and ``Live``) and do not reach the engine: a block request stays accepted
in the store, so the resume asks for it again (``resumed.requested`` tells a client on
another worker which requests to send again).

``Inputs`` is one of the parts ``Service`` (server/service.py) is made of: it works on the
worker's ``Sessions`` and reaches the engine through the ``Gate``; a block request for
block 0 opens a new epoch through the service's ``new_epoch``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np

from worldserve.protocol import (
    Ack,
    Action,
    Block,
    Error,
    ErrorCode,
    Image,
    Observation,
    Prompt,
    ProtocolError,
)
from worldserve.server.engine import Engine
from worldserve.server.gate import Gate
from worldserve.server.live import Live, Shape
from worldserve.server.metrics import Metrics
from worldserve.server.offload import CodecPool
from worldserve.server.prompt_filter import PromptFilter
from worldserve.server.sessions import Sessions
from worldserve.server.settings import Settings
from worldserve.session.plan import encode_action

log = logging.getLogger("worldserve.service")


def seconds(ms: float | None) -> float | None:
    """A message's deadline in milliseconds (or none) as seconds."""
    return None if ms is None else ms / 1000.0


class Inputs:
    """What a client sends to its attached session; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        codecs: CodecPool,
        sessions: Sessions,
        shape: Shape,
        gate: Gate,
        new_epoch: Callable[[Engine, Live, np.ndarray | None], None],
        prompts: PromptFilter,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.codecs = codecs  # images decode here, off the loop
        self.sessions = sessions
        self.shape = shape
        self.gate = gate
        self._new_epoch = new_epoch
        self.prompts = prompts  # every new prompt is screened here first (server/prompt_filter.py)

    def action(self, sid: str, msg: Action) -> None:
        live = self.sessions.attached(sid)
        if msg.seq <= live.seen_seq:
            self.metrics.actions.labels("stale").inc()
            return
        live.seen_seq = msg.seq
        vec = encode_action(frozenset(msg.keys), (msg.mouse[0], msg.mouse[1]))
        if msg.keys:
            self._ignored(live, "keys")
        if msg.mouse[0] or msg.mouse[1]:
            self._ignored(live, "mouse")
        if live.pending is None and live.action_limit.take():
            self._apply_action(live, msg.seq, vec)
            return
        if live.pending is not None:
            self.metrics.actions.labels("coalesced").inc()
        live.pending = (msg.seq, vec)
        if live.action_timer is None:
            loop = asyncio.get_running_loop()
            live.action_timer = loop.call_later(live.action_limit.wait_time(), self._flush_action, live)

    def _ignored(self, live: Live, kind: str) -> None:
        """Say once per connection that the model does not take inputs of ``kind``."""
        controls = self.shape.controls
        if kind in controls or kind in live.told_ignored or live.peer is None:
            return
        live.told_ignored.add(kind)
        live.peer.send(Error(
            ErrorCode.IGNORED_CONTROL,
            f"this model takes {', '.join(controls) or 'no inputs'}; {kind} is ignored", kind,
        ))

    def _flush_action(self, live: Live) -> None:
        live.action_timer = None
        if live.pending is None or self.sessions.get(live.sid) is not live:
            return
        if not live.action_limit.take():
            loop = asyncio.get_running_loop()
            live.action_timer = loop.call_later(live.action_limit.wait_time(), self._flush_action, live)
            return
        (seq, vec), live.pending = live.pending, None
        self._apply_action(live, seq, vec)

    def _apply_action(self, live: Live, seq: int, vec: np.ndarray) -> None:
        live.action, live.action_seq = vec, seq
        engine = self.gate.scheduled(live.sid)
        if engine is not None:
            engine.scheduler.set_action(live.sid, vec, seq)
        self.metrics.actions.labels("applied").inc()

    def _costly(self, live: Live, field: str) -> None:
        """Spend the session's budget for a costly input (a prompt, an observation, a new
        epoch: each costs about a chunk of model time that admission never granted)."""
        if live.input_limit.take():
            return
        raise ProtocolError(
            f"prompts, observations and new epochs are limited to about one per chunk period "
            f"(burst {live.input_limit.burst}); retry in {live.input_limit.wait_time():.2f} s",
            field, ErrorCode.RATE_LIMITED,
        )

    async def prompt(self, sid: str, msg: Prompt) -> Ack:
        self._costly(self.sessions.attached(sid), "prompt")  # before the filter runs: it may cost
        self.gate.require_ready()
        await self.prompts.screen(msg.prompt, "switch", sid)  # refused: the session keeps its prompt
        live = self.sessions.attached(sid)  # it may have ended or moved while the filter ran
        engine = self.gate.require_ready()
        self._ignored(live, "prompt")
        live.session.set_scene(msg.prompt)
        if sid in engine.scheduler:
            engine.set_scene(sid, msg.prompt)
        return Ack("prompt", msg.id)

    async def observe(self, sid: str, msg: Observation) -> Ack:
        self._costly(self.sessions.attached(sid), "image")  # before the image is decoded
        self.gate.require_ready()
        frame = await self.decode_image(msg.image, "image")
        live = self.sessions.attached(sid)  # it may have ended or moved while the image was decoded
        engine = self.gate.require_ready()
        self._ignored(live, "observation")
        if sid in engine.scheduler:
            engine.observe(sid, frame)
        return Ack("observation", msg.id)

    async def _start_frame(self, engine: Engine, live: Live) -> np.ndarray | None:
        """The runner's start frame for a new epoch of ``live``, made on a worker thread, not
        by the model thread while every running session waits; None (the model thread then
        makes it) where the runner has none or it fails."""
        req = live.request
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, engine.runner.first_frame, live.scene, req.seed, req.bucket)
        except Exception:
            log.exception("start frame for a new epoch failed", extra={"sid": live.sid})
            return None

    async def decode_image(self, image: Image, field: str) -> np.ndarray:
        """A client's image as (H, W, 3) uint8, decoded and checked on the codec pool; a bad
        one is a ``ProtocolError`` that names ``field`` and the image's field."""
        try:
            return await self.codecs.run(image.decode, self.settings.max_image_pixels)
        except ProtocolError as exc:
            raise ProtocolError(exc.reason, f"{field}.{exc.field or 'data'}") from None

    async def block(self, sid: str, msg: Block) -> None:
        """Pull mode: a block request, under the store's block_idx rules. Block 0 (a new
        epoch) waits for its start frame, made on a worker thread as a start's is."""
        live = self.sessions.attached(sid)
        engine = self.gate.require_ready()
        if not live.pull:
            raise ProtocolError(
                "block requests are for pull-mode sessions", "block_idx", ErrorCode.WRONG_MODE
            )
        n = msg.block_idx
        if n == 0:
            self._costly(live, "block_idx")  # a new epoch: its first frame costs model time
            first = await self._start_frame(engine, live)
            live = self.sessions.attached(sid)  # it may have ended or moved meanwhile
            self._new_epoch(self.gate.require_ready(), live, first)
            return
        session = self.sessions.store.get(sid)
        outstanding = session.last_block_idx + 1 - live.next_block
        if n == session.last_block_idx + 1 and outstanding >= self.settings.pull_queue:
            raise ProtocolError(
                f"{outstanding} blocks are already outstanding (at most "
                f"{self.settings.pull_queue}, block 0 that start asked for included until it "
                f"arrives); wait for block {live.next_block}",
                "block_idx",
                ErrorCode.RATE_LIMITED,
            )
        decision = self.sessions.store.open_block(sid, n, frames=self.shape.chunk_frames)
        if decision.retransmit:
            ch = live.find(n)
            if ch is not None and live.peer is not None:
                live.peer.chunk(ch, ordered=True)
            return  # not generated yet: it comes when it is
        if sid in engine.scheduler:
            engine.request_block(sid, n, seconds(msg.deadline_ms))
