"""LongLive's two attention modules against the two recipes that cite them, frame for frame.

``LongLivePort`` below re-implements, from reading NVlabs/LongLive v1.0, how its inference runs
a chunk through its KV cache: a cache of ``local_attn_size`` frames (sinks, then the latest
frames) whose keys are written on every forward, a roll that drops the oldest window frames
when a new chunk would overflow it, the sinks protected while frames are recomputed, and
attention over the sinks plus the latest ``local_attn_size - sinks`` frames. RoPE as Wan's
complex table of 1,024 positions, in one of two schemes:

- ``causal_model.py``: keys rotated at their epoch frame when written (``start_frame`` of the
  forward), queries at theirs: the sinks stay at 0-2 while the chunk sits at n.
- ``causal_model_infinity.py``: keys stored unrotated and rotated on read at their place in the
  cache; queries at the end of the cache when it has rolled, else at their place.

The prompt switch is their ``_recache_after_switch`` with ``global_sink``: the latest
``local_attn_size`` frames run again at the context noise under the new prompt, from where they
start, with the old sinks kept when that is past frame 0.

The sampler and the network's other parts (embeddings, modulation, cross-attention, MLP, head)
are the model's own: ``test_reference.py`` checks those against the authors' network.
"""

from __future__ import annotations

import pytest
import torch

from tests.model.wan.tiny import LATENT_HEIGHT as H
from tests.model.wan.tiny import LATENT_WIDTH as W
from tests.model.wan.tiny_runner import run, tiny_runner
from worldserve.model.attention import attend
from worldserve.model.wan.causal import CausalWanModel, TextKV, space_grid, timestep_embedding
from worldserve.model.wan.runner import WanRunner

TABLE = 1024  # positions in Wan's RoPE table


def wan_rope_table(model: CausalWanModel) -> list[torch.Tensor]:
    """Wan's ``rope_params`` for time, height and width: (1024, pairs) complex each."""
    cfg = model.cfg
    d = cfg.head_dim
    out = []
    for dim in (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6)):
        ang = torch.outer(torch.arange(TABLE, dtype=torch.float64),
                          1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        out.append(torch.polar(torch.ones_like(ang), ang))
    return out


def apply_rope(table: list[torch.Tensor], x: torch.Tensor, frames: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """x (1, N*h*w, heads, D) rotated with the frames' time positions ``frames`` (N,), as
    Wan's rope_apply does it: complex pairs times the table's entries, in float64."""
    n = len(frames)
    t, ph, pw = (p.shape[1] for p in table)
    f = torch.cat((
        table[0][frames].view(n, 1, 1, t).expand(n, h, w, t),
        table[1][:h].view(1, h, 1, ph).expand(n, h, w, ph),
        table[2][:w].view(1, 1, w, pw).expand(n, h, w, pw),
    ), -1).reshape(n * h * w, 1, -1)
    xc = torch.view_as_complex(x[0].to(torch.float64).reshape(n * h * w, x.shape[2], -1, 2))
    return torch.view_as_real(xc * f).flatten(2)[None].to(x.dtype)


class LongLivePort:
    """One session's cache and cached forward as LongLive's inference keeps them (counted in
    frames; the authors count tokens, 1,560 a frame at 480x832). ``infinity``: the
    ``causal_model_infinity.py`` scheme, else ``causal_model.py``'s."""

    def __init__(self, model: CausalWanModel, infinity: bool) -> None:
        cfg = model.cfg
        self.model, self.infinity = model, infinity
        self.sinks = cfg.sink_frames
        self.size = cfg.sink_frames + cfg.window_frames + cfg.chunk_frames  # local_attn_size
        self.table = wan_rope_table(model)
        self.tpf = (H // 2) * (W // 2)
        shape = (1, self.size * self.tpf, cfg.num_heads, cfg.head_dim)
        self.k = [torch.zeros(shape) for _ in model.blocks]
        self.v = [torch.zeros(shape) for _ in model.blocks]
        self.global_end = self.local_end = 0  # frames

    @torch.no_grad()
    def forward(self, x: torch.Tensor, t: float, text: TextKV, start: int) -> torch.Tensor:
        """The flow of x (1, C, F, H, W) at timestep t, frames ``start`` .. ``start + F - 1``;
        the cache takes the frames' keys and values, as every forward of the authors does."""
        model, cfg, tpf, s = self.model, self.model.cfg, self.tpf, self.sinks
        f = x.shape[2]
        end = start + f
        recompute = end <= self.global_end and start > 0
        rolls = end > self.global_end and f + self.local_end > self.size
        evict = f + self.local_end - self.size if rolls else 0
        local_end = self.local_end + end - self.global_end - evict
        local_start = local_end - f
        write = max(local_start, s) if recompute else local_start

        tok = model.patch_embedding(x)  # (1, dim, F, h, w)
        hh, ww = tok.shape[3:]
        h = tok.flatten(2).transpose(1, 2)  # (1, F*T, dim)
        e = model.time_embedding(timestep_embedding(cfg.freq_dim, torch.full((f,), float(t))).float())
        e6 = model.time_projection(e).view(1, f, 6, cfg.dim)
        own = torch.arange(start, end)
        for i, blk in enumerate(model.blocks):
            s1, c1, g1, s2, c2, g2 = (m.unsqueeze(2) for m in (blk.modulation.unsqueeze(1) + e6).unbind(2))
            a = (blk.norm1(h).view(1, f, tpf, -1) * (1 + c1) + s1).flatten(1, 2)
            sa = blk.self_attn
            q = sa.norm_q(sa.q(a)).view(1, f * tpf, cfg.num_heads, -1)
            k = sa.norm_k(sa.k(a)).view(1, f * tpf, cfg.num_heads, -1)
            v = sa.v(a).view(1, f * tpf, cfg.num_heads, -1)
            if not self.infinity:
                q, k = apply_rope(self.table, q, own, hh, ww), apply_rope(self.table, k, own, hh, ww)
            ck, cv = self.k[i].clone(), self.v[i].clone()
            if rolls:  # the window moves down over the evicted frames; the sinks stay
                kept = self.local_end - evict - s
                ck[:, s * tpf:(s + kept) * tpf] = ck[:, (s + evict) * tpf:(s + evict + kept) * tpf].clone()
                cv[:, s * tpf:(s + kept) * tpf] = cv[:, (s + evict) * tpf:(s + evict + kept) * tpf].clone()
            ck[:, write * tpf:local_end * tpf] = k[:, (write - local_start) * tpf:]
            cv[:, write * tpf:local_end * tpf] = v[:, (write - local_start) * tpf:]
            rk = ck
            if self.infinity:  # every held frame at its place in the cache, the chunk after them
                rk = ck.clone()
                rk[:, :local_end * tpf] = apply_rope(self.table, ck[:, :local_end * tpf], torch.arange(local_end),
                                                     hh, ww)
                at = self.size - f if rolls else local_start
                q = apply_rope(self.table, q, torch.arange(at, at + f), hh, ww)
            first = max(s, local_end - (self.size - s))
            keys = torch.cat((rk[:, :s * tpf], rk[:, first * tpf:local_end * tpf]), 1)
            vals = torch.cat((cv[:, :s * tpf], cv[:, first * tpf:local_end * tpf]), 1)
            y = attend(q, keys, vals, None)
            self.k[i], self.v[i] = ck, cv
            h = h + (sa.o(y.flatten(2)).view(1, f, tpf, -1) * g1).flatten(1, 2)
            h = h + blk.cross_attn(blk.norm3(h), text.k[i], text.v[i])
            mlp = blk.ffn((blk.norm2(h).view(1, f, tpf, -1) * (1 + c2) + s2).flatten(1, 2))
            h = h + (mlp.view(1, f, tpf, -1) * g2).flatten(1, 2)
        if not recompute:
            self.global_end, self.local_end = end, local_end
        out = model.head(h, e.view(1, f, -1), space_grid(cfg, f, hh, ww, x.device))
        out = out.view(1, f, hh, ww, 1, 2, 2, cfg.out_dim).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(1, cfg.out_dim, f, hh * 2, ww * 2)

    def switch(self, output: torch.Tensor, n: int, text: TextKV) -> None:
        """``_recache_after_switch`` with ``global_sink`` before frame n: output (1, C, n, H, W)."""
        if n == 0:
            return
        count = min(self.size, n)
        self.forward(output[:, :, n - count:n], self.model.cfg.commit_timestep, text, n - count)


def port_rollout(runner: WanRunner, infinity: bool, prompts: dict[int, str], chunks: int, seed: int = 1
                 ) -> torch.Tensor:
    """The authors' interactive inference with the runner's model, prompts and noise."""
    model, cfg = runner.model, runner.cfg
    port = LongLivePort(model, infinity)
    gen = torch.Generator().manual_seed(seed)  # the session's: one chunk's randn a draw
    shape = (1, cfg.out_dim, cfg.chunk_frames, H, W)
    steps, f = cfg.step_timesteps, cfg.chunk_frames
    out: list[torch.Tensor] = []
    text = runner._text_kv(prompts[0])
    for c in range(chunks):
        if c in prompts and c:
            text = runner._text_kv(prompts[c])
            port.switch(torch.cat(out, 2), c * f, text)
        x = torch.randn(shape[1:], generator=gen)[None]
        for i, t in enumerate(steps):
            x0 = x - cfg.sigma(t) * port.forward(x, t, text, c * f)
            if i + 1 < len(steps):
                sigma = cfg.sigma(steps[i + 1])
                x = (1 - sigma) * x0 + sigma * torch.randn(shape[1:], generator=gen)[None]
        port.forward(x0, cfg.commit_timestep, text, c * f)
        out.append(x0)
    return torch.cat(out, 2)[0]


PROMPTS = {0: "a fox in snow", 2: "a fox on a beach", 6: "a fox in a city at night"}  # switches at frames 6, 18
CHUNKS = 8  # 24 latent frames: past frame 12, where the window first rolls past the sinks


@pytest.mark.parametrize("recipe, infinity", [("longlive", False), ("longlive-infinity", True)])
def test_longlive_serves_the_frames_of_the_attention_module_its_config_runs_through_rolls_and_switches(
        recipe, infinity):
    runner = tiny_runner(recipe)
    assert (runner.cfg.sink_frames, runner.cfg.window_frames, runner.cfg.chunk_frames) == (3, 6, 3)
    want = port_rollout(runner, infinity, PROMPTS, CHUNKS)
    got = run(runner, "s", PROMPTS, CHUNKS)
    err = (got - want).abs().amax(dim=(0, 2, 3))  # (24,) by latent frame
    assert err.max() < 1e-4, err


def test_longlive_s_positions_differ_from_the_infinity_module_s_from_latent_frame_12_on():
    """The recipe that cites causal_model.py served with positions by place in the cache (as it
    was before) leaves the authors' frames from latent frame 12 on, where the window first rolls
    past the sinks; before that, and through the switch at frame 6, the two are the same."""
    runner = tiny_runner("longlive", positions="rank")
    want = port_rollout(runner, False, PROMPTS, CHUNKS)
    err = (run(runner, "s", PROMPTS, CHUNKS) - want).abs().amax(dim=(0, 2, 3))
    assert err[:12].max() < 1e-4 and err[12:].min() > 1e-3, err


def test_without_sinks_rank_positions_are_the_authors_absolute_ones_through_every_roll():
    """Self-Forcing, CausVid and Matrix-Game have no sinks: ranks are absolute positions less a
    constant, and RoPE sees differences only."""
    runner = tiny_runner("longlive", sink_frames=0, positions="rank", window_frames=3)
    prompts = {0: "a fox in snow"}
    want = port_rollout(runner, False, prompts, CHUNKS)
    err = (run(runner, "s", prompts, CHUNKS) - want).abs().amax(dim=(0, 2, 3))
    assert err.max() < 1e-5, err
