"""``worldserve drill``: drain a worker under load and check every session.

Starts redis-server (or uses ``--redis``), a router and two workers as separate processes
on loopback ports (clients/local.py), opens N sessions through the router (raw frames,
scripted actions, seeds 0..N-1), drains the worker holding the most sessions while they
stream, and checks each session:

- lost / duplicated: block_idx missing from 0..last, or received twice;
- resume gap: from the last frame the old worker sent to the first the new one sent;
- continuity: PSNR between the frames the session got and a reference run of the same
  session (same seed, prompt and per-block actions, read back from each frame's
  ``action_seq``) generated here in one process with no migration. ``baseline`` is the
  same figure before the migration: batching and thread timing make even an undisturbed
  run differ a little from the batch-1 reference, so continuity is judged against it; the
  first block after the hand-off is reported on its own beside it. The reference runs in
  the workers' float type.
- ``--deterministic``: the settings under which an undisturbed session reproduces bit for
  bit (fp32 workers and reference, one torch thread each, no cross-session batching:
  batches of one, as the reference runs), so every block can be compared exactly. Per
  migrated session and block after the hand-off it reports identical or the PSNR; the goal
  is identical frames (a snapshot carries the session's cache and anchor, so a restore
  goes on exactly), at least 40 dB on every block. Blocks before the hand-off are counted
  the same way: they show the settings do reproduce an undisturbed session.

The workers keep their sessions' steps, fps and bucket under load (only lookahead may be
cut), so the reference is comparable frame by frame. Default: 8 sessions at 4 fps (a 2-core
CPU shared with other work serves ~30 frames/s on one worker), 24 blocks before the drain
and 48 after; ``--quick``: 8 and 12. Writes a JSON
report; the last line is ``drill sessions=<n> lost=<n> duplicated=<n> resume_p99_s=<x>
continuity_psnr_db=<x> first_block_psnr_db=<x> baseline_psnr_db=<x> identical_after=<a>/<b>
min_block_psnr_db=<x> mode=<default|deterministic>`` (PSNR inf: identical); exits 1 if a
block was lost or duplicated or a session on the drained worker did not move, and in
``--deterministic`` mode also if a block after the hand-off is under 40 dB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from worldserve.clients.local import LocalCluster
from worldserve.clients.probe import Probe, percentile
from worldserve.clients.sdk import WorldClient

PROMPT = "a green forest"
BUCKET = 64
DETERMINISTIC_MIN_DB = 40.0  # the goal for every block after the hand-off in --deterministic mode


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="worldserve drill", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases (8 blocks before, 12 after)")
    ap.add_argument("--sessions", type=int, default=None)
    ap.add_argument("--fps", type=float, default=None)
    ap.add_argument("--warm-blocks", type=int, default=None, help="blocks each session gets before the drain")
    ap.add_argument("--after-blocks", type=int, default=None, help="blocks each gets after moving")
    ap.add_argument("--redis", default=None, help="use this Redis instead of starting one")
    ap.add_argument("--weights", type=Path, default=None,
                    help="model weights (default: the shipped ones, else a random-init model)")
    ap.add_argument("--workdir", type=Path, default=None, help="logs and report (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="JSON report (default: WORKDIR/drill.json)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds for each phase")
    ap.add_argument("--deterministic", action="store_true",
                    help="fp32, batches of one: compare every block with an undisturbed run, bit for bit")
    args = ap.parse_args(argv)
    quick = args.quick
    args.sessions = args.sessions or 8
    args.fps = args.fps or 4.0  # 8 sessions on one worker: ~all a loaded 2-core CPU serves
    args.warm_blocks = args.warm_blocks or (8 if quick else 24)
    args.after_blocks = args.after_blocks or (12 if quick else 48)
    return args


def resolve_weights(weights: Path | None, workdir: Path) -> tuple[Path, str]:
    """The weights to serve and what they are (shipped, given, or random-init)."""
    from worldserve.model.default.weights import DEFAULT_WEIGHTS, config_path

    if weights is not None:
        return weights, str(weights)
    if DEFAULT_WEIGHTS.exists() and config_path(DEFAULT_WEIGHTS).exists():
        return DEFAULT_WEIGHTS, "shipped"
    from worldserve.model.default.weights import save_random_model

    return save_random_model(workdir / "random.safetensors"), "random-init (no shipped weights)"


class Reference:
    """The same sessions generated alone, in this process, with no migration; ``canvas`` as the
    workers serve (the server's default: on)."""

    def __init__(self, weights: Path, dtype: str = "float32", canvas: bool = True) -> None:
        from worldserve.model.default.runner import ModelRunner

        self.runner = ModelRunner.from_pretrained(weights, threads=1, max_sessions=2, dtype=dtype, canvas=canvas)

    def frames(self, seed: int, prompt: str, actions: list[np.ndarray]) -> list[np.ndarray]:
        from worldserve.session.plan import Batch, ChunkWork, SessionSpec, StepPlan

        r = self.runner
        r.execute(StepPlan(new_sessions=[SessionSpec("ref", BUCKET, seed, prompt)]))
        out = []
        try:
            for b, a in enumerate(actions):
                plan = StepPlan(batches=[Batch(BUCKET, r.max_steps, [ChunkWork("ref", b, a[None])])])
                result = r.execute(plan)
                if result.errors:
                    raise RuntimeError(f"reference failed at block {b}: {result.errors}")
                out.append(result.results[0].frames[0])
        finally:
            r.execute(StepPlan(freed=["ref"]))
        return out


def psnr(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    if not a:
        return float("nan")
    errs = [np.mean((x.astype(np.float64) - y.astype(np.float64)) ** 2) for x, y in zip(a, b, strict=True)]
    mse = float(np.mean(errs))
    return float("inf") if mse == 0 else 10 * math.log10(255.0**2 / mse)


def check_session(p: Probe, ref: Reference | None) -> dict[str, Any]:
    """The drill's verdict on one session."""
    lost, dup = p.lost_and_duplicated()
    out: dict[str, Any] = {
        "session": p.index, "blocks": len(p.frames), "lost": lost, "duplicated": dup,
        "migrated": bool(p.migrates), "errors": p.errors, "ended": p.ended,
    }
    if not p.migrates:
        return out
    t_mig, mig = p.migrates[0]
    before = [f for f in p.frames if f.t <= t_mig]
    after = [f for f in p.frames if f.t > t_mig]
    out["migrate_block"] = mig.block_idx
    out["target"] = mig.worker
    out["resume_gap_s"] = (after[0].t - before[-1].t) if before and after else None
    out["resumed"] = [dict(block_idx=r.block_idx, replayed=r.replayed, gap_blocks=r.gap_blocks)
                      for _, r in p.resumes]
    if ref is not None and p.frames and all(f.image is not None for f in p.frames):
        by_block = {f.block_idx: f for f in p.frames}
        last = max(by_block)
        seqs, seq = [], 0
        for b in range(last + 1):
            seq = by_block[b].action_seq if b in by_block else seq
            seqs.append(seq)
        reference = ref.frames(p.index, PROMPT, [p.action_vector(s) for s in seqs])
        k = mig.block_idx
        pre = [b for b in sorted(by_block) if b < k]
        post = [b for b in sorted(by_block) if b >= k]
        got = {b: f.image for b, f in by_block.items() if f.image is not None}
        out["baseline_psnr_db"] = psnr([got[b] for b in pre], [reference[b] for b in pre])
        out["continuity_psnr_db"] = psnr([got[b] for b in post], [reference[b] for b in post])
        out["first_block_psnr_db"] = psnr([got[k]], [reference[k]]) if k in got else None
        out["blocks_before"] = _per_block(got, reference, pre)
        out["blocks_after"] = _per_block(got, reference, post)
    return out


def _per_block(got: dict[int, np.ndarray], reference: list[np.ndarray], blocks: list[int]) -> list[dict[str, Any]]:
    """Per block: identical to the reference, and the PSNR (inf when identical)."""
    return [{"block": b, "identical": bool(np.array_equal(got[b], reference[b])),
             "psnr_db": psnr([got[b]], [reference[b]])} for b in blocks if b in got]


def _block_summary(rows: list[dict[str, Any]], key: str) -> tuple[int, int, float]:
    """(identical blocks, blocks compared, lowest PSNR) over the sessions' ``key`` lists."""
    blocks = [b for r in rows for b in r.get(key, [])]
    same = sum(b["identical"] for b in blocks)
    low = min((b["psnr_db"] for b in blocks), default=float("nan"))
    return same, len(blocks), low


async def run_drill(args: argparse.Namespace) -> dict[str, Any]:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="worldserve-drill-"))
    workdir.mkdir(parents=True, exist_ok=True)
    weights, weights_note = resolve_weights(args.weights, workdir)
    n = args.sessions
    # --deterministic: fp32 and batches of one, as the reference runs; else the server's
    # defaults (bf16 where the CPU has it, cross-session batching)
    dtype = "float32" if args.deterministic else "auto"
    cluster = LocalCluster(workdir / "logs", weights, redis_url=args.redis, fps=args.fps,
                           capacity=max(8, n), batch_sizes="1" if args.deterministic else "1,2,4,8",
                           extra_worker_args=["--dtype", dtype])
    from worldserve.model.dtype import (
        pick_dtype,  # the server's pick for "auto": bf16 where the CPU has it
    )

    report: dict[str, Any] = {"sessions": n, "fps": args.fps, "weights": weights_note,
                              "workdir": str(workdir),
                              "mode": "deterministic" if args.deterministic else "default",
                              "dtype": str(pick_dtype(dtype, device="cpu")).removeprefix("torch.")}
    t0 = time.monotonic()
    async with cluster, aiohttp.ClientSession() as http:
        report["startup_s"] = round(time.monotonic() - t0, 2)
        clients = [WorldClient(router=cluster.router_url, http=http, queue_size=4096, max_retries=10)
                   for _ in range(n)]
        probes = [Probe(c, i, keep_images=True) for i, c in enumerate(clients)]
        stop = False
        tasks: list[asyncio.Task[None]] = []
        try:
            for i, c in enumerate(clients):
                await c.start(PROMPT, seed=i, fps=args.fps, codec="raw", bucket=BUCKET, lookahead=1)
            tasks = [asyncio.create_task(p.run(lambda: stop, timeout=args.timeout)) for p in probes]
            await _until(lambda: all(len(p.frames) >= args.warm_blocks for p in probes), args.timeout, "warm-up")
            loads = await cluster.sessions_by_worker()
            victim = cluster.index_of(max(sorted(loads), key=lambda w: loads[w]))
            port = f":{cluster.ports[victim]}/"
            on_victim = [p for p in probes if port in p.client.url]
            report["drained_worker"] = cluster.worker_id(victim)
            report["sessions_on_drained_worker"] = len(on_victim)
            t_drain = time.monotonic()
            await cluster.drain(victim)

            def moved() -> bool:
                return all(p.migrates and sum(f.t > p.migrates[0][0] for f in p.frames) >= args.after_blocks
                           for p in on_victim)

            await _until(moved, args.timeout, "migration")
            report["migration_s"] = round(time.monotonic() - t_drain, 2)
            # The others stream on meanwhile: each gets a few more blocks after the drain.
            counts = [len(p.frames) for p in probes]
            await _until(lambda: all(len(p.frames) >= c + 4 for p, c in zip(probes, counts, strict=True)),
                         args.timeout, "after")
            proc = cluster.procs[victim]
            for _ in range(int(args.timeout * 10)):
                if not proc.alive:
                    break
                await asyncio.sleep(0.1)
            report["drained_worker_exit"] = proc.popen.poll()
        except TimeoutError as exc:  # a box too slow for the load asked: report what was seen
            report["timeout"] = str(exc)
            print(exc, flush=True)
        finally:
            stop = True
            await asyncio.gather(*tasks, return_exceptions=True)
            for c in clients:
                await c.close()
    print(f"drill: streamed for {time.monotonic() - t0:.1f} s; computing the reference run", flush=True)
    ref = Reference(weights, dtype)
    sessions = [check_session(p, ref if p.migrates else None) for p in probes]
    migrated = [s for s in sessions if s["migrated"]]
    same_after, n_after, low_after = _block_summary(migrated, "blocks_after")
    same_before, n_before, low_before = _block_summary(migrated, "blocks_before")
    gaps = [s["resume_gap_s"] for s in migrated if s.get("resume_gap_s") is not None]
    report.update({
        "lost": sum(s["lost"] for s in sessions),
        "duplicated": sum(s["duplicated"] for s in sessions),
        "migrated": len(migrated),
        "not_moved": report.get("sessions_on_drained_worker", 0) - len(migrated),
        "errors": sum(len(s["errors"]) for s in sessions) + ("timeout" in report),
        "resume_p50_s": percentile(gaps, 50),
        "resume_p99_s": percentile(gaps, 99),
        "continuity_psnr_db": _worst(migrated, "continuity_psnr_db"),
        "first_block_psnr_db": _worst(migrated, "first_block_psnr_db"),
        "baseline_psnr_db": _worst(migrated, "baseline_psnr_db"),
        "identical_after": [same_after, n_after],
        "min_block_psnr_db_after": low_after,
        "identical_before": [same_before, n_before],
        "min_block_psnr_db_before": low_before,
        "per_session": sessions,
    })
    return report


def _worst(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
    return min(vals) if vals else float("nan")


async def _until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"drill: {what} did not finish within {timeout:g} s")
        await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = asyncio.run(run_drill(args))
    out = args.out or Path(report["workdir"]) / "drill.json"
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"drill: report {out}; logs {report['workdir']}/logs")
    print(f"drill: drained {report.get('drained_worker')} holding "
          f"{report.get('sessions_on_drained_worker')} sessions in {report.get('migration_s')} s "
          f"(exit {report.get('drained_worker_exit')}); "
          f"resume p50 {report['resume_p50_s']:.3f} s; PSNR vs reference: before "
          f"{report['baseline_psnr_db']:.1f} dB, first block after {report['first_block_psnr_db']:.1f} dB, "
          f"after {report['continuity_psnr_db']:.1f} dB (worst session); weights {report['weights']}")
    same, total = report["identical_after"]
    same_b, total_b = report["identical_before"]
    print(f"drill: {report['mode']} mode ({report['dtype']}); blocks identical to the undisturbed run: "
          f"before the hand-off {same_b}/{total_b} (lowest {report['min_block_psnr_db_before']:.1f} dB), "
          f"after it {same}/{total} (lowest {report['min_block_psnr_db_after']:.1f} dB)")
    print(f"drill sessions={report['sessions']} lost={report['lost']} duplicated={report['duplicated']} "
          f"resume_p99_s={report['resume_p99_s']:.3f} continuity_psnr_db={report['continuity_psnr_db']:.1f} "
          f"first_block_psnr_db={report['first_block_psnr_db']:.1f} baseline_psnr_db={report['baseline_psnr_db']:.1f} "
          f"identical_after={same}/{total} min_block_psnr_db={report['min_block_psnr_db_after']:.1f} "
          f"mode={report['mode']}")
    failed = report["lost"] or report["duplicated"] or report["not_moved"] or report["errors"]
    if args.deterministic and not report["min_block_psnr_db_after"] >= DETERMINISTIC_MIN_DB:
        failed = True
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
