"""Replay a served session from its log, frame for frame.

    worldserve replay LOG [--weights W] [--dtype float32] [--out DIR] [--threads N]

LOG is what ``GET /admin/sessions/{id}/log`` returned (session/logfile.py): the seed and
start, then what the runner was given for each block (actions, steps, bucket, scene changes,
real frames). A fresh runner of the same family opens the session from the seed, is fed those
inputs block by block through the same plan contract the server uses (one session, batches
of one), and each block's frames are checked against the digest the server logged. It prints
one line a block that differs and a summary::

    replay blocks=<n> identical=<k> first_difference=<block or -> model=<name> dtype=<dtype>

and exits 1 unless every block is identical. ``--out`` writes the frames (``frames.npz``
and a PNG a block).

Frames are reproducible where the server's runner was: a server in float32 with batches of
one (``--dtype float32 --warmup-batch-sizes 1``), replayed with the same threads on the same
kind of CPU and the same ``--cpu-trace`` setting (traced chunks and eager ones round apart
by an 8-bit level now and then), matches bit for bit. Frames made in a batch with other sessions, or in bfloat16,
differ in the last bits, and such differences grow as the session goes on; the summary says
from which block.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from worldserve.model import registry
from worldserve.session.errors import SnapshotError
from worldserve.session.eventlog import digest
from worldserve.session.logfile import LogFile, read
from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    ChunkWork,
    Runner,
    SessionSpec,
    SessionUpdate,
    StepPlan,
)

SID = "replay"


def blocks_of(lf: LogFile) -> int:
    """How many blocks the log can replay: up to the newest one whose frames it names."""
    return max(lf.outputs) + 1 if lf.outputs else lf.log.last_block_idx + 1


def replay(lf: LogFile, runner: Runner, num_blocks: int) -> Iterator[tuple[int, np.ndarray]]:
    """Each block's frames, as ``runner`` makes them from the log's inputs."""
    start = lf.log.start
    fpc = runner.frames_per_chunk
    prev = None
    for inp in lf.log.replay(num_blocks):
        missing = [o.digest[:12] for o in inp.observations if o.frame is None]
        if missing:
            raise ValueError(f"block {inp.block_idx}: the log does not carry the real frame(s) "
                             f"{missing} committed before it (a snapshot keeps digests only)")
        frames = [o.frame for o in inp.observations if o.frame is not None]
        plan = StepPlan()
        if prev is None:
            if frames:  # the start frame a server made (``first_frame``), or the client's: as a
                # server does, ask the runner for its start frame, so that it knows its own
                # (the default model's canvas starts from the ground under it: start_views.py)
                runner.first_frame(inp.scene, start.seed, inp.bucket)
            plan.new_sessions.append(SessionSpec(SID, inp.bucket, start.seed, inp.scene,
                                                 frames[-1] if frames else None))
        elif frames or inp.scene != prev.scene or inp.bucket != prev.bucket:
            scene = inp.scene if inp.scene != prev.scene else None
            bucket = inp.bucket if inp.bucket != prev.bucket else None
            plan.updates.append(SessionUpdate(SID, scene, bucket, frames[-1] if frames else None))
        actions = (np.asarray(inp.action, np.float32).reshape(-1, ACTION_DIM) if inp.action
                   else np.zeros((fpc, ACTION_DIM), np.float32))
        work = ChunkWork(SID, inp.block_idx, actions, inp.seq)
        plan.batches.append(Batch(inp.bucket, inp.steps, [work]))
        out = runner.execute(plan)
        if out.errors:
            raise RuntimeError(f"block {inp.block_idx}: the runner failed: {out.errors[SID]}")
        yield inp.block_idx, out.results[0].frames
        prev = inp


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="worldserve replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path, help="a session log (GET /admin/sessions/{id}/log)")
    ap.add_argument("--weights", type=Path, default=None,
                    help="the weights the server ran (default: the family's shipped ones)")
    ap.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or auto")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--cpu-trace", action=argparse.BooleanOptionalAction, default=True,
                    help="run chunks as TorchScript traces, as the server does by default "
                         "(--no-cpu-trace for a server run with it)")
    ap.add_argument("--blocks", type=int, default=None, help="replay only the first N blocks")
    ap.add_argument("--out", type=Path, default=None, help="write frames.npz and PNGs here")
    args = ap.parse_args(argv)
    try:
        lf = read(args.log.read_bytes())
    except OSError as exc:
        raise SystemExit(f"worldserve replay: {exc}") from None
    except SnapshotError as exc:
        raise SystemExit(f"worldserve replay: bad log file: {exc.reason}") from None
    if not lf.log.complete:
        raise SystemExit(f"worldserve replay: the log dropped {lf.log.dropped} events; it no "
                         "longer replays from the seed (raise --log-capacity on the server)")
    if lf.dtype != args.dtype:
        print(f"note: the server ran {lf.dtype}, this replay runs {args.dtype}", file=sys.stderr)
    runner = registry.load(lf.model, registry.LoadOptions(
        weights=args.weights, threads=args.threads, dtype=args.dtype, max_sessions=1,
        cpu_trace=args.cpu_trace, canvas=lf.reference == "canvas"))
    n = blocks_of(lf) if args.blocks is None else min(args.blocks, blocks_of(lf))
    made: list[np.ndarray] = []
    same, first_diff = 0, None
    for block, frames in replay(lf, runner, n):
        made.append(frames)
        want = lf.outputs.get(block)
        if want is None:
            continue
        if digest(frames) == want:
            same += 1
        else:
            first_diff = block if first_diff is None else first_diff
            print(f"block {block}: differs from the served frames")
    if args.out is not None:
        save(args.out, made)
    checked = sum(1 for b in range(n) if b in lf.outputs)
    print(f"replay blocks={n} checked={checked} identical={same} "
          f"first_difference={'-' if first_diff is None else first_diff} "
          f"model={lf.model} dtype={args.dtype}")
    if same != checked:
        raise SystemExit(1)


def save(out: Path, made: list[np.ndarray]) -> None:
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "frames.npz", frames=np.concatenate(made))
    for b, frames in enumerate(made):
        Image.fromarray(np.concatenate(list(frames), axis=1)).save(out / f"block_{b:05d}.png")


if __name__ == "__main__":
    main()
