"""Stream batching against chunk batching and no batching, on the real default model, in one run.

    python -m bench.stream_batch [--quick] [--seconds S] [--threads N] [--dtype D] [--weights PATH]
                                 [--sessions 1 2 3 4 5 6] [--workloads phase spread mixed]

Three ways to share the model between sessions, each run in real time on the same runner:

- ``alone``: no batching; each chunk runs by itself (4 denoising forwards and the commit).
- ``chunk``: sessions whose chunks are due together, at the same step count, run as one
  batch, every forward of the chunk for all of them (a batch per step count).
- ``promote``: as ``chunk``, but chunks due together at fewer steps run in the batch at the
  most steps (what the engine's scheduler does where its cost model says that costs less,
  ``session/batching.py``).
- ``stream``: StreamDiffusion's stream batch. Forwards run back to back; each carries every
  chunk in flight at its own denoising step (its own noise level, adaLN modulation and
  cache context), the commit pass of a finished chunk in the same forward as the others'
  denoising, and a chunk that falls due joins the next forward at its first step.

Workloads (sessions at 24 fps, bucket 64, steady state: caches full):

- ``phase``: every clock in phase, full steps (the engine's steady state: it starts clocks in phase);
- ``spread``: clocks spread evenly over the frame period (pull clients, or sessions whose
  clocks cannot be aligned);
- ``mixed``: clocks in phase, every second session at one step fewer (the ladder's
  middle, where chunk batching splits a batch by step count).

First, the same three sessions are run in phase through ``chunk`` and ``stream`` for 24
frames: their frames must agree (``agree_db``: PSNR of the stream's first frame against the
chunk's, 99 meaning identical; ``agree_frames``: how many frames in a row were identical; a
rounding difference, once there, grows frame after frame). Then two measures:

- At saturation (``phase`` and ``mixed``): the model time of one frame period's chunks of N
  sessions, back to back, the policies taking turns round after round so the machine's
  drift falls on all of them (median of ``--rounds``); ``cap`` is the most sessions whose
  period's work fits in the 41.7 ms period.
- In real time (``--workloads``): a frame is released at its slot and meets its deadline if
  it is made within one frame period of its release; a session more than two periods behind
  skips to its newest slot (the skipped frames count as missed). Per policy, workload and
  session count: the miss rate, p50/p99 latency from release to frame, frames/s and the
  model's busy share; ``held`` is the most sessions with a miss rate of at most 1 %.

Every policy runs the eager path: a stream forward has no recorded trace, and the served
chunk's trace (``bench.trace_freeze``) would set the chunk policies apart by that alone.

Last line: ``stream_batch cap_phase_<policy>=<n> ... cap_mixed_<policy>=<n> ...
held_<workload>_<chunk|promote|stream>=<n> ... agree_db=<x> agree_frames=<n>``
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from worldserve.bench._frame_measures import mse, psnr_of_mse
from worldserve.model.default.net.dit import ChunkInputs, WorldModel
from worldserve.model.default.net.flow import next_noisy
from worldserve.model.default.net.rope import Rope
from worldserve.model.default.runner import ModelRunner
from worldserve.model.default.slot import SessionSlot
from worldserve.model.default.weights import DEFAULT_WEIGHTS
from worldserve.model.dtype import DTYPES, pick_dtype
from worldserve.session.plan import KEYS, Batch, ChunkWork, SessionSpec, StepPlan

FPS = 24.0
PERIOD = 1.0 / FPS
BUCKET = 64
POLICIES = ("alone", "chunk", "promote", "stream")
WORKLOADS = ("phase", "spread", "mixed")
# steady-state one-frame chunks rotate nothing in time (asserted on admit)
NO_ROTATION = Rope(torch.empty(0), torch.empty(0), identity=True)
BEHIND = 2  # periods a session may fall behind before it skips to its newest slot


@dataclass
class Row:
    """One chunk in flight in a stream batch."""

    session: int
    state: SessionSlot
    levels: tuple[float, ...]  # this chunk's noise levels, then the commit level 0.0
    cond: torch.Tensor  # (S, 1, F, 6*W*depth + 2*W): every block's modulation and the head's, per level
    base: torch.Tensor  # (1, F*T, W)
    prev: torch.Tensor  # (1, F, prev_channels, H, W)
    actions: torch.Tensor  # (1, F, A)
    prior: torch.Tensor  # (F, 1, 1, 2, taps)
    ctx_k: torch.Tensor  # (L, 1, Nc + Tq, H, D)
    ctx_v: torch.Tensor
    offsets: torch.Tensor | None
    x: torch.Tensor  # (1, F, C, H, W) this forward's input
    step: int = 0  # == len(levels) - 1: the commit pass
    pixels: torch.Tensor | None = None


@dataclass
class Level:
    """One policy x workload x session count, run in real time."""

    released: int = 0
    missed: int = 0
    latencies: list[float] = field(default_factory=list)
    busy: float = 0.0
    wall: float = 0.0
    forwards: int = 0
    rows: int = 0

    @property
    def miss_rate(self) -> float:
        return self.missed / max(self.released, 1)


class Stream:
    """Chunks in flight, advanced one mixed forward at a time (steady state only). What stays
    the same for a chunk (its cache context, stem base, previous frame, motion prior) is
    gathered once per membership of the batch; the per-level modulation is one gather a
    forward; the sampler's update runs once for the rows at each pair of levels."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.rows: list[Row] = []
        self._static: tuple[list[int], tuple[ChunkInputs, torch.Tensor, torch.Tensor]] | None = None

    def admit(self, chunks: list[tuple[int, SessionSlot, np.ndarray, int]]) -> None:
        """Chunks (session, state, actions, steps) that join the next forward at their first
        step; those that join together at one step count are prepared as one batch."""
        r, cfg = self.runner, self.runner.cfg
        for steps in sorted({c[3] for c in chunks}):
            group = [c for c in chunks if c[3] == steps]
            states = [c[1] for c in group]
            ctx = r.pools[BUCKET].context([s.slot for s in states], np.array([s.frame_index for s in states]))
            assert ctx.mask is None and ctx.rope_q.identity and ctx.rope_k.identity, "steady state only"
            act = torch.from_numpy(np.stack([c[2] for c in group])).to(r.device, r.dtype)
            prev, offsets = r._prev_inputs(states, act)
            scene = torch.stack([s.scene for s in states])
            inp = r.model.prepare_chunk(prev, act, scene, [*cfg.noise_levels(steps), 0.0])
            cond = torch.stack([torch.cat([*(m for blk in inp.mods[i] for m in blk), *inp.final[i]], -1)
                                for i in range(len(inp.levels))])  # (S, B, F, Wc)
            x = r._noise(states, (cfg.frames_per_chunk, cfg.channels, BUCKET, BUCKET))
            fc = cfg.frames_per_chunk
            for j, (session, state, _, _) in enumerate(group):
                sl = slice(j, j + 1)
                self.rows.append(Row(
                    session, state, inp.levels, cond[:, sl], inp.base[sl], inp.prev[sl], inp.actions[sl],
                    inp.prior[j * fc : (j + 1) * fc],
                    ctx.k[:, sl], ctx.v[:, sl], None if offsets is None else offsets[sl], x[sl],
                ))

    @torch.inference_mode()
    def forward(self) -> list[tuple[int, np.ndarray]]:
        """One forward over every chunk in flight; returns the (session, frame) pairs finished."""
        r, model, rows = self.runner, self.runner.model, self.rows
        x = torch.cat([row.x for row in rows])
        x0, ks, vs = mixed_forward(model, x, self._statics(), torch.cat([row.cond[row.step] for row in rows]))
        noisy = [j for j, row in enumerate(rows) if row.step + 2 < len(row.levels)]
        moves: dict[tuple[float, float], list[int]] = {}
        for j in noisy:
            moves.setdefault((rows[j].levels[rows[j].step], rows[j].levels[rows[j].step + 1]), []).append(j)
        for (t, nxt), js in moves.items():  # the sampler's step, for the rows at each pair of levels at once
            # (the chunk path's arithmetic exactly: levels as Python floats, not as tensors)
            idx = torch.tensor(js)
            fresh = r._noise([rows[j].state for j in js], tuple(x.shape[1:]))
            moved = next_noisy(x[idx], x0[idx].clamp(-1, 1), t, nxt, fresh, r.cfg.sampler_eta)
            for i, j in enumerate(js):
                rows[j].x = moved[i : i + 1]
        last = [j for j, row in enumerate(rows) if row.step + 2 == len(row.levels)]
        if last:  # the last denoising step: decode, and commit next
            idx = torch.tensor(last)
            pixels = model.decode(x0[idx].clamp(-1, 1))
            clean = model.encode(pixels).to(r.dtype)
            for i, j in enumerate(last):
                rows[j].pixels, rows[j].x = pixels[i : i + 1], clean[i : i + 1]
        made = [j for j, row in enumerate(rows) if row.step + 1 == len(row.levels)]
        done: list[tuple[int, np.ndarray]] = []
        if made:  # the commit pass: these chunks are made
            idx = torch.tensor(made)
            frames = torch.cat([rows[j].pixels for j in made]).cpu().numpy()  # type: ignore[misc]
            offs = [rows[j].offsets for j in made]
            r._advance([rows[j].state for j in made], x[idx], frames, ks[:, idx], vs[:, idx],
                       None if offs[0] is None else torch.cat(offs))  # type: ignore[arg-type]
            done = [(rows[j].session, frames[i]) for i, j in enumerate(made)]
        for row in rows:
            row.step += 1
        self.rows = [row for row in rows if row.step < len(row.levels)]
        return done

    def _statics(self) -> tuple[ChunkInputs, torch.Tensor, torch.Tensor]:
        """What the rows in flight keep for their whole chunk (stem base, previous frame,
        actions, motion prior; no levels) and their cache keys and values, gathered again only
        when a chunk joins or leaves."""
        ids = [id(row) for row in self.rows]
        if self._static is None or self._static[0] != ids:
            rows, cat = self.rows, torch.cat
            inp = ChunkInputs(
                prev=cat([row.prev for row in rows]), actions=cat([row.actions for row in rows]),
                base=cat([row.base for row in rows]), levels=(), mods=[], final=[],
                prior=cat([row.prior for row in rows]),
            )
            self._static = (ids, (inp, cat([row.ctx_k for row in rows], 1), cat([row.ctx_v for row in rows], 1)))
        return self._static[1]


def mixed_forward(model: WorldModel, x: torch.Tensor, statics: tuple[ChunkInputs, torch.Tensor, torch.Tensor],
                  cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward whose rows are chunks at different steps: x (B, F, C, H, W), each row with
    its own modulation (``cond``: its level's, as ``Row.cond`` packs them) and cache context.
    Returns x0 guesses (B, F, C, H, W) and every block's keys and values (L, B, F*T, H, D)
    (what a commit row keeps; the last block's attention and the head are spent on it)."""
    inp, ctx_k, ctx_v = statics
    f, w = x.shape[1], model.cfg.width
    parts = cond.split(w, -1)  # 6 a block, then the head's shift and scale
    tokens = model._tokens(x, inp)
    rope_sp = model.rope.spatial_frames(x.shape[-1], f, tokens.dtype, tokens.device)
    ks, vs = [], []
    for i, blk in enumerate(model.blocks):
        mod = parts[6 * i : 6 * i + 6]
        tokens, k, v = blk(tokens, mod, f, (rope_sp, NO_ROTATION, NO_ROTATION), (ctx_k[i], ctx_v[i]), None)
        ks.append(k)
        vs.append(v)
    x0 = model._head(tokens, parts[-2], parts[-1], inp.prev, inp.prior)
    return x0, torch.stack(ks), torch.stack(vs)


def open_sessions(runner: ModelRunner, n: int, tag: str) -> list[str]:
    """``n`` fresh sessions, run past their sink frames with a full cache (steady state)."""
    ids = [f"{tag}{i}" for i in range(n)]
    runner.execute(StepPlan(new_sessions=[SessionSpec(s, BUCKET, seed=i, scene="") for i, s in enumerate(ids)]))
    acts = steering(runner, 0)
    pool = runner.pools[BUCKET]
    while not (pool.frame_at[[runner.sessions[s].slot for s in ids]] >= 0).all():
        runner.execute(StepPlan(batches=[_batch(runner, ids, acts)]))
    return ids


def steering(runner: ModelRunner, k: int) -> np.ndarray:
    """Frame ``k``'s actions: forward, turning one way then the other (ground keeps entering the view)."""
    cfg = runner.cfg
    a = np.zeros((cfg.frames_per_chunk, cfg.action_dim), np.float32)
    a[:, KEYS.index("forward")] = 1.0
    a[:, cfg.num_keys] = 0.3 if (k // 48) % 2 == 0 else -0.3
    return a


def _batch(runner: ModelRunner, ids: list[str], acts: np.ndarray, steps: int | None = None) -> Batch:
    s = runner.cfg.denoising_steps if steps is None else steps
    return Batch(BUCKET, s, [ChunkWork(i, 0, acts) for i in ids])


def run_level(runner: ModelRunner, policy: str, workload: str, n: int, seconds: float, tag: str) -> Level:
    cfg = runner.cfg
    ids = open_sessions(runner, n, tag)
    full = cfg.denoising_steps
    steps = [full - (i % 2) if workload == "mixed" else full for i in range(n)]
    phase = [i * PERIOD / n if workload == "spread" else 0.0 for i in range(n)]
    states = [runner.sessions[s] for s in ids]
    lv = Level()
    t0 = time.perf_counter() + 0.02
    end = t0 + seconds
    nxt = [0] * n  # next frame index per session
    flight = [False] * n
    started: dict[int, float] = {}  # session -> release of the frame in flight
    stream = Stream(runner)

    def release(i: int, k: int) -> float:
        return t0 + phase[i] + k * PERIOD

    def finish(i: int, now: float) -> None:
        rel = started.pop(i)
        flight[i] = False
        lv.latencies.append(now - rel)
        lv.missed += now - rel > PERIOD
        nxt[i] += 1

    def ready(now: float) -> list[int]:
        out = []
        for i in range(n):
            if flight[i] or release(i, nxt[i]) > now or release(i, nxt[i]) >= end:
                continue
            newest = int((now - t0 - phase[i]) // PERIOD)
            if newest - nxt[i] >= BEHIND:  # too far behind: skip to the newest slot
                lv.missed += newest - nxt[i]
                nxt[i] = newest
            out.append(i)
        return out

    with torch.inference_mode():
        while True:
            now = time.perf_counter()
            due = ready(now)
            if not due and not stream.rows:
                waits = [release(i, nxt[i]) for i in range(n) if not flight[i] and release(i, nxt[i]) < end]
                if not waits:
                    break
                time.sleep(max(0.0, min(waits) - now))
                continue
            tb = time.perf_counter()
            if policy == "stream":
                for i in due:
                    flight[i], started[i] = True, release(i, nxt[i])
                stream.admit([(i, states[i], steering(runner, nxt[i]), steps[i]) for i in due])
                lv.rows += len(stream.rows)
                done = stream.forward()
                lv.forwards += 1
                t = time.perf_counter()
                for i, _ in done:
                    finish(i, t)
            else:
                due.sort(key=lambda i: release(i, nxt[i]))
                group = [due[0]] if policy == "alone" else due if policy == "promote" else \
                    [i for i in due if steps[i] == steps[due[0]]]
                for i in group:
                    flight[i], started[i] = True, release(i, nxt[i])
                items = [ChunkWork(ids[i], nxt[i], steering(runner, nxt[i])) for i in group]
                run_steps = max(steps[i] for i in group)
                runner._run_chunk(BUCKET, run_steps, items)
                lv.forwards += run_steps + 1
                lv.rows += (run_steps + 1) * len(group)
                t = time.perf_counter()
                for i in group:
                    finish(i, t)
            lv.busy += time.perf_counter() - tb
    lv.wall = time.perf_counter() - t0
    lv.released = sum(int(np.ceil((end - t0 - phase[i]) / PERIOD)) for i in range(n))
    lv.missed += max(0, lv.released - len(lv.latencies) - lv.missed)  # frames never made count as missed
    runner.execute(StepPlan(freed=ids))
    return lv


def agreement(runner: ModelRunner, frames: int = 24) -> tuple[float, int, float]:
    """Three in-phase sessions' frames made by stream batches against the same sessions (same
    seeds, same actions) made by chunk batches: the PSNR (dB, 99 for identical) of the first
    frame, made from the same state by both; how many frames in a row were identical; the
    worst PSNR over the rollout. A rollout amplifies any rounding difference frame after
    frame, and fp32 matrix products on the CPU can round differently with the memory
    alignment of their inputs, so the first frame is what says the two compute the same."""
    a_ids = open_sessions(runner, 3, "agree_a")
    b_ids = open_sessions(runner, 3, "agree_b")  # the same seeds: the same start
    stream = Stream(runner)
    psnr: list[float] = []
    with torch.inference_mode():
        for k in range(frames):
            acts = steering(runner, k)
            ref = runner._run_chunk(BUCKET, runner.cfg.denoising_steps, [ChunkWork(s, k, acts) for s in a_ids])
            stream.admit([(j, runner.sessions[s], acts, runner.cfg.denoising_steps) for j, s in enumerate(b_ids)])
            got: dict[int, np.ndarray] = {}
            while stream.rows:
                got.update(stream.forward())
            err = max(mse(ref[j], got[j]) for j in range(3))
            psnr.append(99.0 if err == 0 else psnr_of_mse(err))
    runner.execute(StepPlan(freed=a_ids + b_ids))
    same = next((i for i, v in enumerate(psnr) if v < 99.0), len(psnr))
    return psnr[0], same, min(psnr)


def period_cost(runner: ModelRunner, workload: str, n: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Model time (s) of one frame period's work for ``n`` sessions at saturation (every
    session's next chunk, back to back), per policy: the median over ``rounds`` rounds that
    take the policies in turn, so the machine's drift falls on all of them; with rows a
    forward (stream) or a batch (chunk)."""
    ids = open_sessions(runner, n, f"sat_{workload}{n}_")
    full = runner.cfg.denoising_steps
    steps = [full - (i % 2) if workload == "mixed" else full for i in range(n)]
    states = [runner.sessions[s] for s in ids]
    stream = Stream(runner)
    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    rows: dict[str, float] = {}
    with torch.inference_mode():
        for k in range(rounds + 1):
            acts = steering(runner, k)
            for policy in POLICIES:
                t0 = time.perf_counter()
                if policy == "stream":
                    stream.admit([(i, states[i], acts, steps[i]) for i in range(n)])
                    fwd = 0
                    while stream.rows:
                        stream.forward()
                        fwd += 1
                    rows["stream"] = sum(s_ + 1 for s_ in steps) / fwd
                else:
                    groups = [[i] for i in range(n)] if policy == "alone" else [list(range(n))] \
                        if policy == "promote" else \
                        [[i for i in range(n) if steps[i] == st] for st in sorted(set(steps), reverse=True)]
                    for g in groups:
                        run_steps = max(steps[i] for i in g)
                        runner._run_chunk(BUCKET, run_steps, [ChunkWork(ids[i], k, acts) for i in g])
                    rows[policy] = n / len(groups)
                if k:  # the first round is a warm-up
                    times[policy].append(time.perf_counter() - t0)
    runner.execute(StepPlan(freed=ids))
    return {p: (float(np.median(times[p])), rows[p]) for p in POLICIES}


def held(levels: dict[int, Level]) -> int:
    best = 0
    for n in sorted(levels):
        if levels[n].miss_rate <= 0.01:
            best = n
        else:
            break
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 s a real-time level, 20 saturation rounds")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=60, help="rounds of the saturation timing")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="auto", choices=DTYPES)
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS,
                    help="real-time workloads (none: the saturation timing only)")
    args = ap.parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    rounds = 20 if args.quick else args.rounds
    torch.set_num_threads(args.threads)
    dtype = pick_dtype(args.dtype)
    runner = ModelRunner.from_pretrained(args.weights, dtype=dtype, max_sessions=2 * max(args.sessions) + 8)
    print(f"stream_batch: dtype={str(dtype).removeprefix('torch.')} threads={args.threads} bucket={BUCKET} "
          f"{seconds:g} s a level")
    agree, same, worst = agreement(runner)
    print(f"agreement: stream vs chunk batches, 3 sessions x 24 frames in phase: first frame {agree:.1f} dB "
          f"(99: identical), identical for {same} frames, worst {worst:.1f} dB")

    print(f"\nat saturation: ms of model time for one frame period's chunks (median of {rounds} rounds, "
          f"policies in turn); fits: <= {PERIOD * 1e3:.1f} ms")
    print(f"{'workload':<8} {'sessions':>8} " + " ".join(f"{p + '_ms':>9} {'rows':>5}" for p in POLICIES))
    cap: dict[tuple[str, str], int] = {}
    for workload in ("phase", "mixed"):
        for n in sorted(args.sessions):
            cost = period_cost(runner, workload, n, rounds)
            print(f"{workload:<8} {n:>8} " + " ".join(f"{cost[p][0] * 1e3:>9.1f} {cost[p][1]:>5.2f}" for p in POLICIES),
                  flush=True)
            for p in POLICIES:
                if cost[p][0] <= PERIOD:
                    cap[(workload, p)] = n
    print("capacity (the most sessions whose period's work fits in the period):")
    for workload in ("phase", "mixed"):
        print(f"  {workload:<8} " + "  ".join(f"{p}={cap.get((workload, p), 0)}" for p in POLICIES))

    print(f"\nin real time, {seconds:g} s a level:")
    print(f"{'workload':<8} {'policy':<7} {'sessions':>8} {'miss':>7} {'p50_ms':>7} {'p99_ms':>7} "
          f"{'fps':>6} {'busy':>5} {'rows/fwd':>8}")
    result: dict[tuple[str, str], int] = {}
    tag = 0
    for workload in args.workloads:
        for policy in POLICIES:
            levels: dict[int, Level] = {}
            for n in sorted(args.sessions):
                tag += 1
                lv = run_level(runner, policy, workload, n, seconds, f"w{tag}_")
                levels[n] = lv
                lat = np.asarray(lv.latencies) * 1e3 if lv.latencies else np.asarray([np.nan])
                print(f"{workload:<8} {policy:<7} {n:>8} {lv.miss_rate:>7.3f} {np.percentile(lat, 50):>7.1f} "
                      f"{np.percentile(lat, 99):>7.1f} {len(lv.latencies) / lv.wall:>6.1f} "
                      f"{lv.busy / lv.wall:>5.2f} {lv.rows / max(lv.forwards, 1):>8.2f}", flush=True)
                if lv.miss_rate > 0.10:  # past what this policy holds: more sessions only miss more
                    break
            result[(workload, policy)] = held(levels)
    print("held in real time (sessions at 24 fps, miss rate <= 1 %):")
    for workload in args.workloads:
        print(f"  {workload:<8} " + "  ".join(f"{p}={result[(workload, p)]}" for p in POLICIES))
    keys = [f"cap_{w}_{p}={cap.get((w, p), 0)}" for w in ("phase", "mixed") for p in POLICIES]
    keys += [f"held_{w}_{p}={result[(w, p)]}" for w in args.workloads for p in ("chunk", "promote", "stream")]
    print("stream_batch " + " ".join(keys) + f" agree_db={agree:.1f} agree_frames={same}")


if __name__ == "__main__":
    main()
