"""The engine loop: ``schedule`` on the event loop, ``execute`` on the model thread, ``update``.

One asyncio task runs the loop; one dedicated executor thread owns the model, so model work
never blocks the event loop. The loop sleeps until the scheduler's next wake-up or until new
work arrives (``wake``: every session call that adds work does it). Finished chunks go to
each session's ``Outbox``: push chunks into a one-slot ``LatestFrame`` at their display time
(a chunk generated ahead is held on a timer until then), pull chunks into an ordered bounded
queue. Every event also goes to ``on_event`` (metrics, transports, logs).

Loop shape, as every background loop here: ``CancelledError`` exits quietly, other
exceptions are logged with the session ids, cleanup always runs, ``stop()`` cancels then
awaits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import Generic, TypeVar

import numpy as np

from session.admission import Admission
from session.plan import Runner, SessionSpec, StepOutput, StepPlan
from session.scheduler import ChunkReady, Event, Mode, Scheduler

log = logging.getLogger(__name__)

T = TypeVar("T")


class FrameQueue(Generic[T]):
    """A bounded buffer between the engine and one sender: when full, the oldest item is
    dropped (and counted), never the producer blocked. ``await get()`` returns None once
    closed and drained."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self._items: deque[T] = deque()
        self._capacity = capacity
        self._ready = asyncio.Event()
        self._closed = False
        self.drops = 0

    def put(self, item: T) -> None:
        if self._closed:
            return
        if len(self._items) >= self._capacity:
            self._items.popleft()
            self.drops += 1
        self._items.append(item)
        self._ready.set()

    async def get(self) -> T | None:
        while not self._items:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        self._closed = True
        self._ready.set()


class LatestFrame(FrameQueue[T]):
    """One-slot holder: ``put`` replaces an unsent item (counted in ``drops``)."""

    def __init__(self) -> None:
        super().__init__(1)


class Outbox:
    """Where one session's finished chunks wait for its transport."""

    def __init__(self, session_id: str, ordered_capacity: int) -> None:
        self.session_id = session_id
        self.latest: LatestFrame[ChunkReady] = LatestFrame()  # push mode
        self.ordered: FrameQueue[ChunkReady] = FrameQueue(ordered_capacity)  # pull mode

    def close(self) -> None:
        self.latest.close()
        self.ordered.close()


def model_executor() -> ThreadPoolExecutor:
    """The single thread that owns the model (warm it up here, then hand it to the Engine)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldserve-model")


class Engine:
    """Drives a ``Scheduler`` and a ``Runner``; owns the model thread once started."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        *,
        clock: Callable[[], float] | None = None,
        executor: ThreadPoolExecutor | None = None,
        batching: bool = True,
        pace: bool = True,
        ordered_capacity: int = 8,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self._clock = clock or scheduler.clock  # one clock for deadlines and pacing
        self._executor = executor  # shut down by stop(), whoever made it
        self._pace = pace  # False: push chunks go to LatestFrame as soon as they are ready
        self._ordered_capacity = ordered_capacity
        self._on_event = on_event
        self._outboxes: dict[str, Outbox] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self.steps = 0  # plans executed
        self.failure: BaseException | None = None  # set if the loop died of a bug
        scheduler.set_batching(batching)

    # --- sessions (event-loop thread only) ---

    def add_session(
        self,
        session_id: str,
        spec: SessionSpec,
        *,
        fps: float,
        lookahead: int = 0,
        steps: int | None = None,
        mode: Mode = Mode.PUSH,
        priority: int = 0,
        first_block: int = 0,
    ) -> Admission:
        """Admit (see ``Scheduler.add_session``); an admitted session gets an ``Outbox``."""
        verdict = self.scheduler.add_session(
            session_id,
            spec,
            fps=fps,
            lookahead=lookahead,
            steps=steps,
            mode=mode,
            priority=priority,
            now=self._clock(),
            first_block=first_block,
        )
        if verdict.admitted:
            self._outboxes[session_id] = Outbox(session_id, self._ordered_capacity)
            self.wake()
        return verdict

    def remove_session(self, session_id: str) -> None:
        self.scheduler.remove_session(session_id)
        box = self._outboxes.pop(session_id, None)
        if box is not None:
            box.close()
        self.wake()

    def outbox(self, session_id: str) -> Outbox:
        return self._outboxes[session_id]

    def set_action(self, session_id: str, action: np.ndarray, seq: int) -> bool:
        return self.scheduler.set_action(session_id, action, seq)

    def set_scene(self, session_id: str, prompt: str) -> None:
        self.scheduler.set_scene(session_id, prompt)
        self.wake()

    def observe(self, session_id: str, frame: np.ndarray) -> None:
        self.scheduler.observe(session_id, frame)
        self.wake()

    def request_block(self, session_id: str, block_idx: int, deadline: float | None = None) -> bool:
        queued = self.scheduler.request_block(session_id, block_idx, deadline, self._clock())
        self.wake()
        return queued

    def wake(self) -> None:
        """New work: make the loop look at the scheduler now."""
        self._wake.set()

    # --- lifecycle ---

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("an engine starts once; make a new one")
        self._started = True
        if self._executor is None:
            self._executor = model_executor()
        self._task = asyncio.create_task(self._run(), name="worldserve-engine")

    async def stop(self) -> None:
        """Cancel the loop, wait for it and for the model thread; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():
                    raise  # stop() itself was cancelled
        executor, self._executor = self._executor, None
        if executor is not None:  # a plan may still be running on it: wait off the loop
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)

    # --- the loop ---

    async def _run(self) -> None:
        try:
            while True:
                self._wake.clear()
                now = self._clock()
                plan = self.scheduler.schedule(now)
                if plan.is_empty():
                    self._dispatch(self.scheduler.take_events())
                    await self._idle(now)
                    continue
                out = await self._execute(plan)
                self.steps += 1
                self._dispatch(self.scheduler.update(plan, out, self._clock()))
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.failure = exc
            log.exception(
                "engine loop failed; sessions %s stop getting frames", sorted(self._outboxes)
            )
        finally:
            self._cleanup()

    async def _execute(self, plan: StepPlan) -> StepOutput:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self.runner.execute, plan)
        except Exception as exc:  # the plan failed as a whole: each of its sessions gets the error
            ids = _session_ids(plan)
            log.exception("runner failed a plan; sessions %s", ids)
            return StepOutput(errors={sid: f"runner failed: {exc!r}" for sid in ids})

    async def _idle(self, now: float) -> None:
        delay = self.scheduler.next_wakeup(now) - now
        if delay == float("inf"):
            await self._wake.wait()
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(delay, 0.0005))

    def _dispatch(self, events: list[Event]) -> None:
        if not events:
            return
        loop = asyncio.get_running_loop()
        now = self._clock()
        for ev in events:
            box = self._outboxes.get(ev.session_id) if isinstance(ev, ChunkReady) else None
            if box is not None and isinstance(ev, ChunkReady):
                if ev.display_time is None:  # pull: in order, the client asked for each
                    box.ordered.put(ev)
                elif self._pace and ev.display_time > now:  # push, ahead: hold until shown
                    self._hold(loop, ev.display_time - now, box.latest, ev)
                else:
                    box.latest.put(ev)
            if self._on_event is not None:
                try:
                    self._on_event(ev)
                except Exception:
                    log.exception(
                        "event handler failed on %s for session %s",
                        type(ev).__name__,
                        getattr(ev, "session_id", None),
                    )

    def _hold(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: float,
        holder: LatestFrame[ChunkReady],
        ev: ChunkReady,
    ) -> None:
        """Put ``ev`` into ``holder`` after ``delay`` seconds (its display time)."""

        def fire() -> None:
            self._timers.discard(handle)
            holder.put(ev)

        handle = loop.call_later(delay, fire)
        self._timers.add(handle)

    def _cleanup(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        for box in self._outboxes.values():
            box.close()


def _session_ids(plan: StepPlan) -> list[str]:
    ids = {w.session_id for b in plan.batches for w in b.items}
    ids.update(s.session_id for s in plan.new_sessions)
    ids.update(u.session_id for u in plan.updates)
    return sorted(ids)
