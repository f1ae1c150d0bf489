"""Rolling Forcing's sampler at tiny size against a port of the authors' window pass.

``RollingPort`` below re-implements, from reading TencentARC/RollingForcing's
``pipeline/rolling_forcing_inference.py`` and ``wan/modules/causal_model.py``, how its inference
runs: a clean cache of 24 frames whose first block (the anchor) is stored unrotated and never
rolled out; a window forward of up to 5 blocks at staggered levels that writes its oldest block's
keys, reads the anchor rotated to sit just before the latest clean block, that block, and
itself; each block's x0 noised again to its next level but the oldest, which a pass at t = 0
writes into the cache (reading the latest 21 frames, itself among them, the anchor at its own
place while it is among them) and the video keeps. The network's other parts are the model's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from tests.model.wan.test_longlive_positions import apply_rope, wan_rope_table
from tests.model.wan.tiny import LATENT_HEIGHT as H
from tests.model.wan.tiny import LATENT_WIDTH as W
from tests.model.wan.tiny_dir import HEIGHT, WIDTH, load_tiny
from tests.model.wan.tiny_runner import BUCKET, run, run_frames, tiny_runner
from worldserve.model.attention import attend
from worldserve.model.registry import check
from worldserve.model.wan.causal import CausalWanModel, TextKV, space_grid, timestep_embedding
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.runner import WanRunner
from worldserve.session.plan import ACTION_DIM, Batch, ChunkWork, SessionSpec, StepPlan

CACHE = 24  # frames of the authors' clean cache (kv_cache_size 1560 * 24)
ATTENDED = 21  # max_attention_size, in frames


class RollingPort:
    """One session's clean cache and cached forward as Rolling Forcing's inference keeps them,
    counted in frames (the authors count tokens, 1,560 a frame)."""

    def __init__(self, model: CausalWanModel) -> None:
        cfg = model.cfg
        self.model, self.block = model, cfg.chunk_frames
        self.table = wan_rope_table(model)
        self.tpf = (H // 2) * (W // 2)
        shape = (1, CACHE * self.tpf, cfg.num_heads, cfg.head_dim)
        self.k = [torch.zeros(shape) for _ in model.blocks]
        self.v = [torch.zeros(shape) for _ in model.blocks]
        self.global_end = self.local_end = 0

    @torch.no_grad()
    def forward(self, x: torch.Tensor, t: torch.Tensor, text: TextKV, start: int, updating: bool) -> torch.Tensor:
        model, cfg, tpf, blk_len = self.model, self.model.cfg, self.tpf, self.block
        f = x.shape[2]
        end = start + blk_len  # only the window's first block is cached
        new = end - self.global_end
        rolls = new > 0 and new + self.local_end > CACHE
        evict = new + self.local_end - CACHE if rolls else 0
        local_end = self.local_end + end - self.global_end - evict
        local_start = local_end - blk_len
        tok = model.patch_embedding(x)
        hh, ww = tok.shape[3:]
        h = tok.flatten(2).transpose(1, 2)
        e = model.time_embedding(timestep_embedding(cfg.freq_dim, t).float())
        e6 = model.time_projection(e).view(1, f, 6, cfg.dim)
        own = torch.arange(start, start + f)
        T = tpf
        for i, blk in enumerate(model.blocks):
            s1, c1, g1, s2, c2, g2 = (m.unsqueeze(2) for m in (blk.modulation.unsqueeze(1) + e6).unbind(2))
            a = (blk.norm1(h).view(1, f, tpf, -1) * (1 + c1) + s1).flatten(1, 2)
            sa = blk.self_attn
            q = sa.norm_q(sa.q(a)).view(1, f * tpf, cfg.num_heads, -1)
            k = sa.norm_k(sa.k(a)).view(1, f * tpf, cfg.num_heads, -1)
            v = sa.v(a).view(1, f * tpf, cfg.num_heads, -1)
            rq, rk = apply_rope(self.table, q, own, hh, ww), apply_rope(self.table, k, own, hh, ww)
            ck, cv = self.k[i], self.v[i]
            if rolls:  # the anchor stays, the rest moves down over the evicted frames
                kept = self.local_end - evict - blk_len
                dst = slice(blk_len * T, (blk_len + kept) * T)
                src = slice((blk_len + evict) * T, (blk_len + evict + kept) * T)
                ck[:, dst] = ck[:, src].clone()
                cv[:, dst] = cv[:, src].clone()
            ck[:, local_start * T:local_end * T] = (k if local_start == 0 else rk)[:, :blk_len * T]
            cv[:, local_start * T:local_end * T] = v[:, :blk_len * T]
            if local_start == 0:
                keys, vals = rk, v
            elif updating:  # the clean pass: the latest 21 frames, itself among them
                first = max(0, local_end - ATTENDED)
                keys, vals = ck[:, first * T:local_end * T].clone(), cv[:, first * T:local_end * T]
                if first == 0:
                    keys[:, :blk_len * T] = apply_rope(self.table, keys[:, :blk_len * T], torch.arange(blk_len), hh, ww)
            else:  # the window: the anchor just before the latest clean block, that block, itself
                room = ATTENDED - f - blk_len
                first = max(blk_len, local_start - room)
                held = local_start - first
                anchor = apply_rope(self.table, ck[:, :blk_len * T], torch.arange(blk_len) + start - held - blk_len,
                                    hh, ww)
                keys = torch.cat((anchor, ck[:, first * T:local_start * T], rk), 1)
                vals = torch.cat((cv[:, :blk_len * T], cv[:, first * T:local_start * T], v), 1)
            y = attend(rq, keys, vals, None)
            h = h + (sa.o(y.flatten(2)).view(1, f, tpf, -1) * g1).flatten(1, 2)
            h = h + blk.cross_attn(blk.norm3(h), text.k[i], text.v[i])
            mlp = blk.ffn((blk.norm2(h).view(1, f, tpf, -1) * (1 + c2) + s2).flatten(1, 2))
            h = h + (mlp.view(1, f, tpf, -1) * g2).flatten(1, 2)
        if new > 0:
            self.global_end = end
            self.local_end = local_end
        out = model.head(h, e.view(1, f, -1), space_grid(cfg, f, hh, ww, x.device))
        out = out.view(1, f, hh, ww, 1, 2, 2, cfg.out_dim).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(1, cfg.out_dim, f, hh * 2, ww * 2)


def port_blocks(runner: WanRunner, prompt: str, blocks: int, seed: int = 1) -> torch.Tensor:
    """The authors' rolling inference with the runner's model, prompt and noise (the session's
    generator: each tick the new block's randn, then each renoised block's, oldest first):
    the first ``blocks`` blocks the video keeps, (C, blocks * F, h, w)."""
    model, cfg = runner.model, runner.cfg
    port, f, steps = RollingPort(model), cfg.chunk_frames, cfg.step_timesteps
    text = runner._text_kv(prompt)
    gen = torch.Generator().manual_seed(seed)
    shape = (cfg.out_dim, f, H, W)
    noisy: dict[int, torch.Tensor] = {}
    kept: list[torch.Tensor] = []
    tick = 0
    while len(kept) < blocks:
        first = max(0, tick - len(steps) + 1)
        noisy[tick] = torch.randn(shape, generator=gen)
        window = list(range(first, tick + 1))
        x = torch.cat([noisy[b] for b in window], 1)[None]
        t = torch.tensor([steps[tick - b] for b in window]).repeat_interleave(f)
        x0 = x - (t / cfg.num_train_timesteps)[None, None, :, None, None] * port.forward(x, t, text, first * f, False)
        for j, b in enumerate(window):
            if tick - b + 1 < len(steps):
                sigma = cfg.sigma(steps[tick - b + 1])
                noisy[b] = (1 - sigma) * x0[0, :, j * f:(j + 1) * f] + sigma * torch.randn(shape, generator=gen)
        port.forward(x0[:, :, :f], torch.zeros(f), text, first * f, True)
        if tick - first == len(steps) - 1:
            kept.append(x0[0, :, :f])
        tick += 1
    return torch.cat(kept, 1)


BLOCKS = 10  # 14 window passes: the clean cache rolls past its 24 frames and the anchor leaves the clean pass


def test_the_rolling_window_serves_the_authors_blocks_tick_by_tick():
    runner = tiny_runner("rolling-forcing")
    assert (runner.cfg.sampler, runner.cfg.positions, runner.cfg.sink_frames) == ("rolling", "absolute", 3)
    want = port_blocks(runner, "a red fox", BLOCKS)
    got = run(runner, "s", {0: "a red fox"}, BLOCKS)
    err = (got - want).abs().amax(dim=(0, 2, 3))  # by latent frame
    assert err.max() < 1e-4, err
    assert runner.sessions["s"].flight is not None and runner.sessions["s"].flight.frames == 4 * 3


def test_a_snapshot_carries_the_blocks_in_flight_and_the_session_goes_on_from_them():
    a, b = tiny_runner("rolling-forcing"), tiny_runner("rolling-forcing")
    run(a, "s", {0: "a red fox"}, 3)
    st = a.export_state("s")
    assert st.family_state["rolling_in_flight"].shape == (4, 12, H, W)
    out = b.execute(StepPlan(new_sessions=[SessionSpec("s", BUCKET, seed=1, scene="a red fox", restore=st)]))
    assert not out.errors, out.errors
    torch.testing.assert_close(b.sessions["s"].flight.latents, a.sessions["s"].flight.latents)
    np.testing.assert_array_equal(b.pools[BUCKET].frame_at[b.sessions["s"].slot],
                                  a.pools[BUCKET].frame_at[a.sessions["s"].slot])
    for runner in (a, b):  # both go on from the same blocks in flight
        act = np.zeros((runner.frames_per_chunk, ACTION_DIM), np.float32)
        out = runner.execute(StepPlan(batches=[Batch(BUCKET, runner.max_steps, [ChunkWork("s", 3, act)])]))
        assert not out.errors and out.results[0].frames.shape[0] == 12, out.errors
    assert b.sessions["s"].frame_index == a.sessions["s"].frame_index == 12
    torch.testing.assert_close(b.sessions["s"].recent[-1], a.sessions["s"].recent[-1], atol=1e-5, rtol=1e-5)


def test_serve_model_rolling_forcing_loads_a_weights_dir_and_streams_its_blocks(wan_dir, tmp_path):
    """``--model rolling-forcing --weights DIR`` through the registry, the tiny VAE decoding:
    the first block after its 5 ticks as 9 pixel frames, then 12 a tick."""
    d = Path(shutil.copytree(wan_dir, tmp_path / "w"))
    path = d / "transformer" / "config.json"
    raw = json.loads(path.read_text())
    arch = ("dim", "ffn_dim", "freq_dim", "text_dim", "in_dim", "out_dim", "num_heads", "num_layers", "text_len",
            "patch_size", "eps", "qk_norm", "cross_attn_norm", "model_type", "image_dim", "rope_theta")
    path.write_text(json.dumps({k: v for k, v in raw.items() if k not in WanConfig.__dataclass_fields__ or k in arch}))
    check("rolling-forcing", d)
    runner = load_tiny("rolling-forcing", d)
    assert isinstance(runner, WanRunner) and runner.served.describe(runner.cfg)["sampler"] == "rolling"
    _, frames = run_frames(runner, "s", {0: "a red fox"}, 2)
    assert frames.shape == (9 + 12, HEIGHT, WIDTH, 3) and frames.std() > 1
