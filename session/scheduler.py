"""The per-frame deadline scheduler: what the model generates next, for whom, in which batch.

The engine step is ``plan = schedule(now)``, ``out = runner.execute(plan)``,
``events = update(plan, out, now)``. Between steps the server calls ``add_session``,
``remove_session``, ``set_action``, ``set_scene``, ``observe`` and ``request_block``.

How ``schedule`` picks work:

- Counters, not phases. A push session has a next block (``next_block``) and the display
  slot it is meant for (``display_slot``, from its ``FrameClock``). Start-up, steady streaming and
  catch-up after a stall are the same path: the next block is due at ``due(slot)``.
- A push chunk may start ``release_ahead`` chunk periods before it is due. One that can no
  longer make its slot's display time, even alone, skips slots until it can: the client
  repeats its last frame, gets a ``FrameSkipped`` and block_idx stays consecutive: the
  block is late, not lost (it is shown at the later slot). A
  session's first chunk has no frame to repeat: its clock moves to that slot instead, as
  it does when a first chunk finishes late (its open took model time). When
  several sessions of one key are that late at once (saturation), each skips to a slot a
  batch of all of them can make and they start together, so being late never reduces the
  server to batches of one. A late
  pull request (the client waits for that block) runs after every on-time batch of the plan.
- Earliest deadline first across compatibility keys (bucket, steps). A batch is led by the
  earliest eligible chunk of its key; chunks of that key due within ``batch_window`` of the
  lead join it, in deadline order, while the cost model says the batch still finishes
  (after the batches before it in the plan) before every member's deadline, up to the
  largest warmed batch size. A push member's deadline is its display time less ``margin``:
  lookahead says how early a chunk is due and may start, and near saturation a batch may
  spend it, because splitting a batch to finish early costs more model time than it
  saves. So a late or tight session never holds an on-time batch back: it is not a member.
- Clocks in phase: a new push session's display grid starts in phase with a running
  session of the same bucket, steps and fps (its first frame up to one period later), so
  sessions that join at any moment fall due together and share batches.
- Pull sessions keep to the rate they were admitted at (``fps``, what admission and the
  ladder count them for): ``PULL_BURST`` requests may start at once, then one a chunk
  period; a request made faster waits, and its deadline counts from when it may start.
  So a client that keeps many requests outstanding takes no model time from the others.
- Admission below the asked settings is reported like any later ladder move: a
  ``DegradationChanged`` from level 0, with what was given up.
- Each session has at most one chunk per plan; a plan carries the new sessions' full
  ``SessionSpec`` once, then only ``SessionUpdate`` changes, and the ids to free.

``update`` folds results back in, reports events (``ChunkReady`` in block order per
session, misses, skips, runner errors, cost drift, degradation) and every
``control_interval`` lets the ``DegradeController`` move sessions on their ladders.

The events are defined in ``session/events.py``, ``Mode``, ``RunnerInfo`` and
``SchedulerOptions`` in ``session/options.py``; this module re-exports them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from worldserve.session.admission import Admission, decide
from worldserve.session.batching import Item, Key, form_batches
from worldserve.session.changes import Changes, note_applied
from worldserve.session.clock import FrameClock, pull_due
from worldserve.session.costmodel import CostModel, Demand, Load
from worldserve.session.degrade import (
    DegradationChanged,
    DegradeController,
    LadderState,
    Rung,
    build_ladder,
    describe_change,
)
from worldserve.session.eventlog import Applied
from worldserve.session.events import (
    ChunkReady,
    DeadlineMiss,
    Event,
    FrameSkipped,
    RunnerError,
    SessionStats,
)
from worldserve.session.options import Mode, RunnerInfo, SchedulerOptions
from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    ChunkWork,
    SessionSpec,
    StepOutput,
    StepPlan,
)
from worldserve.session.records import Record, edf

__all__ = [
    "ChunkReady",
    "DeadlineMiss",
    "Event",
    "FrameSkipped",
    "Key",
    "Mode",
    "RunnerError",
    "RunnerInfo",
    "Scheduler",
    "SchedulerOptions",
    "SessionStats",
]


_Item = Item[Record]

# A pull session's requests start at most this many blocks at once, then one per period
# of the rate it was admitted at (``fps``).
PULL_BURST = 2


class Scheduler:
    """Earliest-deadline-first batching of chunk work across sessions."""

    def __init__(
        self,
        info: RunnerInfo,
        cost: CostModel,
        clock: Callable[[], float] = time.monotonic,
        options: SchedulerOptions | None = None,
    ) -> None:
        self.info = info
        self.cost = cost
        self.options = o = options or SchedulerOptions()
        self.clock = clock  # the engine reads the same clock
        self._max_batch = max(info.batch_sizes) if o.batching else 1
        self.load = Load(cost, self._max_batch)
        self.controller = DegradeController(o.degrade)
        self._records: dict[str, Record] = {}
        self._inflight: dict[str, Record] = {}
        self._changes = Changes()
        self._events: list[Event] = []
        self._order = 0
        self._last_control = float("-inf")

    # --- sessions (called by the server between steps) ---

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
        now: float | None = None,
        first_block: int = 0,
    ) -> Admission:
        """Admit (maybe degraded) and start scheduling, or refuse; running sessions stay."""
        info, o = self.info, self.options
        if session_id in self._records:
            raise ValueError(f"session {session_id!r} is already scheduled")
        if spec.session_id != session_id:
            raise ValueError(f"spec is for session {spec.session_id!r}, not {session_id!r}")
        if spec.bucket not in info.buckets:
            raise ValueError(f"bucket {spec.bucket} is not one of the runner's {info.buckets}")
        steps = info.max_steps if steps is None else steps
        if not 1 <= steps <= info.max_steps:
            raise ValueError(f"steps must be in 1..{info.max_steps}, got {steps}")
        if not fps > 0 or lookahead < 0:
            raise ValueError(
                f"need fps > 0 and lookahead >= 0, got fps={fps!r} lookahead={lookahead!r}"
            )
        pull = mode is Mode.PULL
        rungs, verdict = self._decide(spec.bucket, fps, lookahead, steps, pull)
        if not verdict.admitted:
            return verdict
        now = self.clock() if now is None else now
        state = LadderState(session_id, priority, self._order, rungs, verdict.level, changed_at=now)
        self._order += 1
        s = state.settings
        period = info.frames_per_chunk / s.fps
        start = period if o.start_delay is None else o.start_delay
        t0 = now + start + s.lookahead * period
        if o.align_phase and not pull:
            t0 = self._in_phase(t0, s)
        frame_clock = FrameClock(
            t0, s.fps, info.frames_per_chunk, s.lookahead, info.frames_in_block(first_block)
        )
        actions = np.zeros((info.frames_per_chunk, ACTION_DIM), np.float32)
        rec = Record(
            session_id,
            replace(spec, bucket=s.bucket),
            pull,
            state,
            frame_clock,
            first_block,
            actions,
        )
        self._set_release(rec)
        self._records[session_id] = rec
        self._changes.open(rec)
        self.load.add(self._demand_of(s))
        if verdict.level > 0:  # admitted below what it asked for: said like any other move
            self._events.append(
                DegradationChanged(session_id, 0, verdict.level, describe_change(rungs[0], s), s)
            )
        return verdict

    def _decide(
        self, bucket: int, fps: float, lookahead: int, steps: int, pull: bool,
    ) -> tuple[tuple[Rung, ...], Admission]:
        o = self.options
        requested = Rung(float(fps), 0 if pull else lookahead, steps, bucket)
        rungs = build_ladder(requested, self.info.buckets, min_steps=min(o.min_steps, steps), min_fps=o.min_fps,
                             step_counts=self.info.step_counts)
        return rungs, decide(rungs, self.load, self._demand_of, o.admission)

    def would_admit(self, bucket: int, *, fps: float, lookahead: int = 0, mode: Mode = Mode.PUSH) -> Admission:
        """What ``add_session`` would decide now, changing nothing: a start asks before any
        work is done for it (its first frame rendered, a detached session evicted)."""
        return self._decide(bucket, fps, lookahead, self.info.max_steps, mode is Mode.PULL)[1]

    def remove_session(self, session_id: str) -> None:
        """Stop scheduling; the runner frees the session's state in the next plan."""
        rec = self._get(session_id)
        del self._records[session_id]
        self.load.remove(self._demand_of(rec.ladder.settings))
        self._changes.remove(rec)

    def set_action(self, session_id: str, action: np.ndarray, seq: int) -> bool:
        """Latest action wins; an older ``seq`` than the last one is ignored (returns False)."""
        rec = self._get(session_id)
        vec = np.asarray(action, dtype=np.float32)
        if vec.shape != (ACTION_DIM,):
            raise ValueError(f"action must have shape ({ACTION_DIM},), got {vec.shape}")
        if seq < rec.action_seq:
            return False
        rec.actions = np.repeat(vec[None, :], self.info.frames_per_chunk, axis=0)
        rec.action_seq = seq
        return True

    def set_scene(self, session_id: str, prompt: str) -> None:
        rec = self._get(session_id)
        rec.spec = replace(rec.spec, scene=prompt)  # a (re-)open starts from the latest scene
        if rec.opened:
            rec.scene = prompt
            self._changes.mark(rec)

    def observe(self, session_id: str, frame: np.ndarray) -> None:
        """Commit a real frame ((H, W, 3) uint8) into the session's cache before its next chunk."""
        rec = self._get(session_id)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(
                f"observation must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}"
            )
        if not rec.opened:
            rec.spec = replace(rec.spec, observation=frame)
            return
        rec.observation = frame
        self._changes.mark(rec)

    def request_block(
        self,
        session_id: str,
        block_idx: int,
        deadline: float | None = None,
        now: float | None = None,
    ) -> bool:
        """Pull mode: queue block ``block_idx``; False for a repeat of a queued or sent block."""
        rec = self._get(session_id)
        if not rec.pull:
            raise ValueError(f"session {session_id!r} is in push mode; it cannot request blocks")
        expected = rec.next_block + len(rec.requests)
        if block_idx < expected:
            return False
        if block_idx > expected:
            raise ValueError(
                f"session {session_id!r} requested block {block_idx}, expected {expected}"
            )
        if len(rec.requests) >= self.options.pull_queue:
            raise ValueError(f"session {session_id!r} has {len(rec.requests)} requests outstanding")
        now = self.clock() if now is None else now
        # Held to the rate it was admitted at (GCRA: PULL_BURST blocks at once, then one a
        # period), so that asking faster takes no model time from others; its deadline
        # counts from when the rate lets it start.
        period = self.info.frames_per_chunk / rec.ladder.settings.fps
        start = max(now, rec.pull_tat - (PULL_BURST - 1) * period)
        rec.pull_tat = max(rec.pull_tat, start) + period
        due = pull_due(start, deadline, self.options.pull_deadline)
        rec.requests.append((block_idx, start, due))
        return True

    def pull_tat(self, session_id: str) -> float:
        """A pull session's rate clock (GCRA's next theoretical arrival); ``carry_pull_tat``
        hands it to its next record, so a new epoch starts with no fresh burst."""
        return self._get(session_id).pull_tat

    def carry_pull_tat(self, session_id: str, tat: float) -> None:
        rec = self._get(session_id)
        rec.pull_tat = max(rec.pull_tat, tat)

    def set_batching(self, on: bool) -> None:
        """Cross-session batching on (up to the largest warmed size) or off (batches of 1)."""
        self._max_batch = max(self.info.batch_sizes) if on else 1
        self.load.max_batch = self._max_batch

    # --- the engine step ---

    def schedule(self, now: float | None = None) -> StepPlan:
        """What the runner should do now; sessions in the plan are in flight until ``update``."""
        now = self.clock() if now is None else now
        o = self.options
        plan = StepPlan()
        self._changes.into(plan, now)
        window = o.batch_window if self._max_batch > 1 else 0.0
        horizon = now + window
        groups: dict[Key, list[_Item]] = {}
        late: dict[Key, list[_Item]] = {}
        cost1: dict[Key, float] = {}
        catch_up = self._catch_up_costs(now)
        for rec in self._records.values():
            if rec.in_flight or not rec.opened or rec.retry_at > now:
                continue
            s = rec.ladder.settings
            key = (s.bucket, s.steps)
            c1 = cost1.get(key)
            if c1 is None:
                c1 = cost1[key] = self.cost.predict(s.bucket, s.steps, 1)
            if rec.pull:
                if rec.requests:
                    _, start, due = rec.requests[0]
                    if start > horizon:  # over its rate: not yet
                        continue
                    if start <= now and now + c1 > due:
                        late.setdefault(key, []).append(_Item(due, due, True, rec))
                    else:
                        groups.setdefault(key, []).append(_Item(due, due, start <= now, rec))
                continue
            if rec.release > horizon:  # cannot lead or join a batch yet
                continue
            clk = rec.clock
            period = clk.chunk_period
            hard = clk.display(rec.display_slot) - o.margin
            if hard < now + c1:
                # skip to a slot the late sessions of this key can make together: alone
                # when it is the only one, in one batch when many are (saturation), so
                # that being late never condemns the server to batches of one
                ck = catch_up.get(key, c1)
                slot = clk.slot_at(now + ck + o.margin + 1e-6)
                if rec.committed == 0:  # nothing on screen to repeat: its clock starts later
                    clk.anchor(rec.display_slot, clk.display(slot))
                    rec.start_slips += slot - rec.display_slot
                    self._set_release(rec)
                else:
                    self._skip(rec, slot, now)
                hard = clk.display(rec.display_slot) - o.margin
                # several behind start now, as one batch; so does one whose chunk takes
                # longer than its release lead: its release would leave no slack, and the
                # least wake-up delay would make it skip again, slot after slot
                if ck > c1 or c1 >= o.release_ahead * period:
                    groups.setdefault(key, []).append(_Item(hard - clk.lookahead * period, hard, True, rec))
                    continue
            due = hard - clk.lookahead * period
            release = now + max(o.release_ahead * period, c1)
            if due > release:  # not eligible to lead yet; the cached release used an older
                self._set_release(rec)  # cost estimate: refresh it so next_wakeup agrees
            if due <= release + window:
                target = hard
                groups.setdefault(key, []).append(_Item(due, target, due <= release, rec))
        plan.batches += form_batches(
            groups, now, predict=self.cost.predict, max_batch=self._max_batch,
            window=self.options.batch_window, rank=edf, make=self._batch,
        )
        for key, items in late.items():  # overdue pull requests: after all on-time work
            items.sort(key=edf)
            for i in range(0, len(items), self._max_batch):
                part = items[i : i + self._max_batch]
                plan.batches.append(self._batch(key, part, part[0].target))
        return plan

    def update(self, plan: StepPlan, out: StepOutput, now: float | None = None) -> list[Event]:
        """Fold the runner's output back in; return events in order (chunks in block order)."""
        now = self.clock() if now is None else now
        events, self._events = self._events, []
        for timing in out.timings:
            drift = self.cost.observe(timing)
            if drift is not None:
                events.append(drift)
        results = {r.session_id: r for r in out.results}
        note_applied(plan, out, self._records)
        failed: set[str] = set()
        for batch, done in zip(plan.batches, self._finish_times(plan, out, now), strict=True):
            for work in batch.items:
                rec = self._inflight.pop(work.session_id, None)
                if rec is None or self._records.get(work.session_id) is not rec:
                    continue  # removed while in flight
                rec.in_flight = False
                res = results.get(rec.sid)
                err = out.errors.get(rec.sid)
                if err is None and res is not None and res.block_idx == work.block_idx:
                    applied = Applied(batch.bucket, batch.steps, work.actions, work.action_seq,
                                      rec.applied_scene, tuple(rec.applied_observations))
                    rec.applied_scene, rec.applied_observations = None, []
                    self._commit(rec, res.frames, res.action_seq, done, now, events, applied)
                    continue
                failed.add(rec.sid)
                msg = err or f"runner returned no result for block {work.block_idx}"
                events.append(RunnerError(rec.sid, msg, work.block_idx))
        for sid, msg in out.errors.items():
            if sid not in failed and sid in self._records:
                failed.add(sid)
                events.append(RunnerError(sid, msg))
        for rec in self._inflight.values():  # not in the plan's batches: never ran
            rec.in_flight = False
        self._inflight.clear()
        if failed:
            self._changes.retry(plan, failed, self._records, now)
        self._control(now, events)
        return events

    def take_events(self) -> list[Event]:
        """Events raised by ``schedule`` (skips) when no ``update`` follows (empty plan)."""
        events, self._events = self._events, []
        return events

    def next_wakeup(self, now: float | None = None) -> float:
        """When ``schedule`` next has something to do (``now`` if it has now; inf if never)."""
        now = self.clock() if now is None else now
        best = self._changes.next_retry()
        if best <= now:
            return now
        for rec in self._records.values():
            if rec.in_flight or not rec.opened:
                continue
            if rec.pull:
                t = max(rec.retry_at, rec.requests[0][1]) if rec.requests else float("inf")
            else:
                t = max(rec.release, rec.retry_at)
            if t <= now:
                return now
            best = min(best, t)
        return best

    # --- queries ---

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def utilisation(self) -> float:
        """Predicted model utilisation of all sessions at their current settings."""
        return self.load.utilisation()

    def stats(self, session_id: str, now: float | None = None) -> SessionStats:
        rec = self._get(session_id)
        now = self.clock() if now is None else now
        fpc = self.info.frames_per_chunk
        due = 0 if rec.pull else rec.clock.frames_before(rec.clock.slots_displayed(now))
        first = rec.next_block - rec.committed  # the block this scheduling began at
        committed = self.info.block_start(rec.next_block) - self.info.block_start(first)
        return SessionStats(
            Mode.PULL if rec.pull else Mode.PUSH,
            rec.ladder.level,
            rec.ladder.settings,
            rec.next_block,
            rec.committed,
            committed,
            due,
            rec.skipped_slots * fpc,
            rec.misses,
            rec.errors,
        )

    # --- internals ---

    def _get(self, session_id: str) -> Record:
        rec = self._records.get(session_id)
        if rec is None:
            raise KeyError(f"session {session_id!r} is not scheduled")
        return rec

    def _set_release(self, rec: Record) -> None:
        """Cache when the push session's next chunk may start: ``release_ahead`` chunk
        periods before it is due, or earlier when one chunk alone takes longer than that
        (otherwise a session slower than its frame period would skip every slot forever).
        Call after anything that moves its slot or clock."""
        clk = rec.clock
        o = self.options
        s = rec.ladder.settings
        ahead = max(o.release_ahead * clk.chunk_period, self.cost.predict(s.bucket, s.steps, 1))
        rec.release = clk.due(rec.display_slot) - o.margin - ahead

    def _in_phase(self, t0: float, s: Rung) -> float:
        """The first time at or after ``t0`` on the display grid of a running push session
        with the same bucket, steps and fps: clocks in phase fall due together and batch,
        where clocks a few milliseconds apart would each run alone."""
        for rec in self._records.values():
            r = rec.ladder.settings
            if not rec.pull and (r.bucket, r.steps, r.fps) == (s.bucket, s.steps, s.fps):
                return rec.clock.next_display(t0)
        return t0

    def _demand_of(self, s: Rung) -> Demand:
        return Demand(s.bucket, s.steps, self.info.frames_per_chunk / s.fps)

    def _catch_up_costs(self, now: float) -> dict[Key, float]:
        """Per key, the predicted time of one batch holding every push session of that key
        that is too late for its slot even alone (capped at the largest batch size)."""
        counts: dict[Key, int] = {}
        for rec in self._records.values():
            if rec.in_flight or not rec.opened or rec.retry_at > now or rec.pull:
                continue
            s = rec.ladder.settings
            key = (s.bucket, s.steps)
            alone = self.cost.predict(s.bucket, s.steps, 1)
            if rec.clock.display(rec.display_slot) - self.options.margin < now + alone:
                counts[key] = counts.get(key, 0) + 1
        return {
            key: self.cost.predict(key[0], key[1], min(n, self._max_batch)) for key, n in counts.items()
        }

    def _batch(self, key: Key, items: list[_Item], deadline: float) -> Batch:
        works = []
        for it in items:
            rec = it.rec
            rec.in_flight = True
            self._inflight[rec.sid] = rec
            works.append(ChunkWork(rec.sid, rec.next_block, rec.actions, rec.action_seq))
        return Batch(key[0], key[1], works, deadline)

    def _skip(self, rec: Record, slot: int, now: float) -> None:
        n = slot - rec.display_slot
        if n <= 0:
            return
        fpc = self.info.frames_per_chunk
        shown = rec.clock.display(rec.display_slot)
        self._events.append(
            FrameSkipped(rec.sid, rec.next_block, rec.next_block - 1, n * fpc, shown)
        )
        rec.skipped_slots += n
        rec.display_slot = slot
        self._set_release(rec)
        self.controller.note_miss(now)

    def _commit(
        self,
        rec: Record,
        frames: np.ndarray,
        seq: int,
        done: float,
        now: float,
        events: list[Event],
        applied: Applied,
    ) -> None:
        if rec.pull:
            deadline = rec.requests.popleft()[2]
            display: float | None = None
        else:
            deadline = display = rec.clock.display(rec.display_slot)
            if rec.committed == 0 and done > deadline:  # late first frame: the clock moves
                display = rec.clock.next_display(done)  # to the next slot on its grid,
                rec.clock.anchor(rec.display_slot, display)  # so peers stay in phase
                deadline = display
            rec.display_slot += 1
            self._set_release(rec)
        events.append(ChunkReady(rec.sid, rec.next_block, frames, seq, display, applied))
        if done > deadline:
            events.append(DeadlineMiss(rec.sid, rec.next_block, deadline, done))
            rec.misses += 1
            self.controller.note_miss(now)
        rec.next_block += 1
        rec.committed += 1

    def _finish_times(self, plan: StepPlan, out: StepOutput, now: float) -> list[float]:
        """When each batch finished: from the timings when there is one per batch, else now."""
        if len(out.timings) != len(plan.batches):
            return [now] * len(plan.batches)
        t = now - sum(tm.seconds for tm in out.timings)
        times = []
        for tm in out.timings:
            t += tm.seconds
            times.append(t)
        return times

    def _control(self, now: float, events: list[Event]) -> None:
        if now - self._last_control < self.options.control_interval:
            return
        self._last_control = now
        states = [r.ladder for r in self._records.values()]
        for state, old_level in self.controller.tick(now, states, self.load, self._demand_of):
            rec = self._records[state.session_id]
            old, new = state.rungs[old_level], state.settings
            rec.clock.lookahead = new.lookahead
            if new.fps != old.fps:
                rec.clock.retime(rec.display_slot, new.fps)
            self._set_release(rec)
            if new.bucket != old.bucket:
                rec.spec = replace(rec.spec, bucket=new.bucket)
                if rec.opened:
                    rec.bucket_dirty = True
                    self._changes.mark(rec)
            events.append(
                DegradationChanged(rec.sid, old_level, state.level, describe_change(old, new), new)
            )
