"""What a joining or resuming session, or a running one's observation or prompt change, costs the
sessions already running: the real default model behind the engine, in-process, no network.

    python -m bench.join_churn [--canvas] [--arrive start|resume] [--no-ready] [--event observe|prompt]
                               [--steady 3] [--joins 8] [--stay 2] [--gap 2] [--quiet 10]
                               [--threads N] [--dtype D]

``--steady`` push-mode sessions at the smallest bucket ask for 24 fps at full quality and steer
(a random key, changed every 250 ms, as in ``bench.serve_load``). Once they have run for a
few seconds, the bench counts their missed frames (deadline misses and skipped display slots)
over ``--quiet`` seconds with nobody joining; then ``--joins`` visitors join one after the
other (each start frame rendered off the model thread, as the server does), hold a key for
``--stay`` seconds and leave, ``--gap`` seconds apart. With ``--arrive resume`` each visitor
is a session coming back from a snapshot instead (a client resuming after a drop, a session
migrated in): ``--joins`` sessions are steered for two seconds before anything else runs and
suspended, and each visitor is restored from one of their snapshots, made ready off the model
thread first as the server does (``ModelRunner.ready_restore``; ``--no-ready``: not, the
snapshot's canvas rebuilt by the model thread). With ``--event observe|prompt`` nobody joins:
``--joins`` times, one of the running sessions gets an observation (another place's frame)
or a prompt change (``PROMPTS``: new looks, a canvas drawn anew, and one re-skin), and the
window counts from it. For each join it prints the steady
sessions' missed frames from the moment the visitor asks to join (its start frame still to
render) until ``WINDOW`` seconds after it is added, and the visitor's time from asking to its
first frame; the last line (each a single line, wrapped here):

    join_churn arrive=<start|resume> steady=<n> joins=<n> quiet_missed_per_s=<x>
        missed_per_join=<x> join_miss_share=<x> visitor_first_frame_ms=<p50>
    join_churn event=<observe|prompt> steady=<n> events=<n> quiet_missed_per_s=<x>
        missed_per_event=<x> event_miss_share=<x>

``missed_per_join``: the steady sessions' frames missed in a join's window, all of them
together, less what the quiet seconds miss in ``WINDOW`` seconds (its mean over the joins);
``join_miss_share``: of the frames due them in those windows, the share missed. A session
that joins costs the others nothing when missed_per_join is 0; ``missed_per_event`` and
``event_miss_share`` are the same for an event's window.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import torch

from worldserve.bench._steer import steer
from worldserve.bench.serve_load import BATCH_SIZES, NEVER, frames_due, frames_missed
from worldserve.model.default.reference.canvas.tile_decode import DECODE_MODES
from worldserve.model.default.runner import ModelRunner
from worldserve.model.dtype import DTYPES
from worldserve.server.engine import Engine, Suspension, model_executor
from worldserve.session.admission import AdmissionOptions
from worldserve.session.costmodel import CostModel
from worldserve.session.events import ChunkReady, Event
from worldserve.session.plan import ACTION_DIM, SessionSpec
from worldserve.session.scheduler import Mode, RunnerInfo, Scheduler, SchedulerOptions
from worldserve.session.warmup import warm_up
from worldserve.world import start_frame

PROMPTS = ("a grassy village at night", "a snowy forest at dusk", "a sandy desert by day", "a grassy village by day")
WINDOW = 1.5  # seconds after a join whose misses are the join's
SETTLE = 3.0  # seconds the steady sessions run before anything is counted


async def churn(runner: ModelRunner, args: argparse.Namespace) -> None:
    bucket = runner.buckets[0]
    timings = warm_up(runner, runner.buckets[:1], tuple(range(2, runner.max_steps + 1)), BATCH_SIZES)
    info = RunnerInfo(runner.buckets, runner.frames_per_chunk, runner.max_steps, BATCH_SIZES)
    opts = SchedulerOptions(degrade=NEVER, admission=AdmissionOptions(threshold=1e9))
    scheduler = Scheduler(info, CostModel(timings), time.monotonic, opts)
    first: dict[str, float] = {}

    def on_event(e: Event) -> None:
        if isinstance(e, ChunkReady) and e.session_id not in first:
            first[e.session_id] = time.monotonic()

    engine = Engine(scheduler, runner, executor=model_executor(), on_event=on_event)
    loop = asyncio.get_running_loop()
    steady = [f"steady{i}" for i in range(args.steady)]
    stop = asyncio.Event()

    async def join(sid: str, seed: int, back: Suspension | None = None) -> float:
        """Open ``sid`` as the server does (restored from ``back``: resumed as the server
        does); the moment it was asked for."""
        t = time.monotonic()
        if back is None:
            frame = await loop.run_in_executor(None, runner.first_frame, "", seed, bucket)
            spec, first_block = SessionSpec(sid, bucket, seed=seed, scene="", observation=frame), 0
        else:
            assert back.state is not None
            if not args.no_ready:
                await loop.run_in_executor(None, runner.ready_restore, back.state)
            spec = SessionSpec(sid, bucket, seed=seed, scene=back.state.scene, restore=back.state)
            first_block = back.next_block
        verdict = engine.add_session(sid, spec, fps=24.0, lookahead=1, mode=Mode.PUSH, first_block=first_block)
        if not verdict.admitted:
            raise RuntimeError(f"{sid} refused: {verdict}")
        return t

    async def change(sid: str, j: int) -> None:
        """``args.event`` for running session ``sid``, as the server hands it over."""
        if args.event == "observe":  # a client's frame of another place, decoded off the model thread
            frame = await loop.run_in_executor(None, start_frame, "", 200 + j, bucket)
            engine.observe(sid, frame)
        else:
            engine.set_scene(sid, PROMPTS[j % len(PROMPTS)])

    def missed() -> tuple[int, int]:
        stats = [scheduler.stats(s) for s in steady]
        return frames_missed(stats), frames_due(stats)

    await engine.start()
    try:
        backs: list[Suspension | None] = [None] * args.joins
        if args.arrive == "resume":
            backs = list(await snapshots(engine, join, args.joins))
        for i, sid in enumerate(steady):
            await join(sid, i)
        steering = asyncio.create_task(steer(engine, steady, stop))
        await asyncio.sleep(SETTLE)
        m0, _ = missed()
        await asyncio.sleep(args.quiet)
        quiet = (missed()[0] - m0) / args.quiet
        print(f"  quiet: {args.steady} steady sessions miss {quiet:.2f} frames/s with nobody joining")
        per_join, shares, firsts = [], [], []
        held = np.zeros(ACTION_DIM, np.float32)
        held[0] = 1.0

        def window(before: tuple[int, int]) -> tuple[int, int]:
            """The steady sessions' frames missed and due since ``before``, counted for the means."""
            after = missed()
            lost, due = after[0] - before[0], after[1] - before[1]
            per_join.append(lost - quiet * WINDOW)
            shares.append(lost / max(due, 1))
            return lost, due

        for j in range(args.joins):
            before = missed()
            if args.event is not None:  # a running session's observation or prompt change
                await change(steady[j % len(steady)], j)
                await asyncio.sleep(WINDOW)
                lost, due = window(before)
                print(f"  {args.event} {j + 1}: steady sessions missed {lost} of {due} frames in {WINDOW:g} s")
                await asyncio.sleep(max(0.0, args.stay - WINDOW) + args.gap)
                continue
            sid = f"visitor{j}"
            t = await join(sid, 100 + j, backs[j])
            engine.scheduler.set_action(sid, held, 1)
            await asyncio.sleep(WINDOW)
            lost, due = window(before)
            firsts.append(1e3 * (first.get(sid, float("nan")) - t))
            print(f"  join {j + 1}: steady sessions missed {lost} of {due} frames in {WINDOW:g} s; "
                  f"the visitor's first frame after {firsts[-1]:.0f} ms")
            await asyncio.sleep(max(0.0, args.stay - WINDOW))
            engine.remove_session(sid)
            await asyncio.sleep(args.gap)
        stop.set()
        await steering
        if args.event is not None:
            print(f"join_churn event={args.event} steady={args.steady} events={args.joins} "
                  f"quiet_missed_per_s={quiet:.2f} "
                  f"missed_per_event={np.mean(per_join):.2f} event_miss_share={np.mean(shares):.4f}")
            return
        print(f"join_churn arrive={args.arrive} steady={args.steady} joins={args.joins} quiet_missed_per_s={quiet:.2f} "
              f"missed_per_join={np.mean(per_join):.2f} join_miss_share={np.mean(shares):.4f} "
              f"visitor_first_frame_ms={np.nanmedian(firsts):.0f}")
    finally:
        await engine.stop()


async def snapshots(engine: Engine, join: Callable[[str, int], Awaitable[float]], n: int) -> list[Suspension]:
    """``n`` sessions steered two seconds, each its own way, then suspended: their snapshots."""
    ids = [f"donor{j}" for j in range(n)]
    for j, sid in enumerate(ids):
        await join(sid, 100 + j)
        a = np.zeros(ACTION_DIM, np.float32)
        a[j % 4] = a[(j + 1) % 4 if j % 2 else (j + 2) % 4] = 1.0  # diagonals and straight runs
        engine.scheduler.set_action(sid, a, 1)
    await asyncio.sleep(2.0)
    out = [await engine.suspend(sid) for sid in ids]
    if any(s.state is None for s in out):
        raise RuntimeError("a donor session left no snapshot")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="What a joining session costs the sessions already running.")
    ap.add_argument("--steady", type=int, default=3)
    ap.add_argument("--joins", type=int, default=8)
    ap.add_argument("--stay", type=float, default=2.0)
    ap.add_argument("--gap", type=float, default=2.0)
    ap.add_argument("--quiet", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="auto", choices=DTYPES)
    ap.add_argument("--canvas", action="store_true", help="serve on the world canvas (the server's default)")
    ap.add_argument("--arrive", default="start", choices=("start", "resume"),
                    help="visitors start fresh, or resume from snapshots (a resume, a session migrated in)")
    ap.add_argument("--event", choices=("observe", "prompt"),
                    help="no visitors: a running session gets an observation or a prompt change instead, --joins times")
    ap.add_argument("--no-ready", action="store_true",
                    help="resume: the snapshot's canvas rebuilt by the model thread (not made ready off it first)")
    ap.add_argument("--canvas-decode", default="auto", choices=DECODE_MODES)
    args = ap.parse_args(argv)
    if args.stay < WINDOW:
        ap.error(f"--stay must be at least the {WINDOW:g} s window a join is measured over")
    torch.set_num_threads(args.threads)
    runner = ModelRunner.from_pretrained(max_sessions=max(2 * max(BATCH_SIZES), args.steady + 2), dtype=args.dtype,
                                         trace=True, canvas=args.canvas, canvas_decode=args.canvas_decode)
    kind = "on the world canvas" if runner.ground is not None else "on its own frames (no canvas)"
    arrive = "fresh starts" if args.arrive == "start" else "resumes" + (" (no ready_restore)" if args.no_ready else "")
    if args.event is not None:
        arrive = f"{args.event} events"
    print(f"default model {kind}, {str(runner.dtype).removeprefix('torch.')}, {args.threads} thread(s), "
          f"bucket {runner.buckets[0]}, {args.steady} steady sessions at 24 fps, {args.joins} joins ({arrive})")
    asyncio.run(churn(runner, args))


if __name__ == "__main__":
    main()
