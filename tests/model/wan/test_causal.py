"""The causal transformer's KV cache against a full-sequence block-causal forward, and its
discipline: constant memory, bounded positions, re-cache, errors that name indices.

``full_forward`` below runs every frame of a sequence at once, with no cache: each layer
computes every frame's queries, keys and values, and each chunk attends to what the cache
would hold for it (the sinks, the last K frames before it, itself), with RoPE time positions
given by the documented rule (rank among the visible frames; ``model/wan/cache.py``). Since
those positions depend on the query chunk once the window has rolled with sinks, the
attention runs one query chunk at a time; everything else runs over the whole sequence.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.model.wan.tiny import LATENT_HEIGHT as H
from tests.model.wan.tiny import LATENT_WIDTH as W
from tests.model.wan.tiny import random_model, tiny_config
from worldserve.model.attention import attend
from worldserve.model.plan_walk import CacheFull
from worldserve.model.wan.cache import WanKVCache, rope_frequencies, rotate
from worldserve.model.wan.causal import TextKV, space_grid, timestep_embedding
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.sampler import add_noise, generate_chunk, to_x0

# ---------------------------------------------------------------------------- the full forward


def visible_frames(cfg: WanConfig, start: int) -> list[int]:
    """Frames a chunk starting at ``start`` attends to besides itself: sinks, then the window."""
    sinks = list(range(min(cfg.sink_frames, start)))
    window = list(range(max(cfg.sink_frames, start - cfg.window_frames), start))
    return sinks + window


def time_angles(cfg: WanConfig, positions: list[int], t: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.tensor(positions, dtype=torch.float64).repeat_interleave(t)[:, None]
    ang = pos * rope_frequencies(cfg, cfg.rope_pairs[0])
    return ang.cos().float()[None, :, None], ang.sin().float()[None, :, None]  # (1, N*T, 1, Pt)


@torch.no_grad()
def full_forward(model, x: torch.Tensor, t: torch.Tensor, text: TextKV) -> torch.Tensor:
    """Flow prediction of every frame of x (1, C, N, H, W) at per-frame timesteps t (N,)."""
    cfg = model.cfg
    n, f = x.shape[2], cfg.chunk_frames
    tok = model.patch_embedding(x)  # (1, dim, N, h, w)
    hh, ww = tok.shape[3:]
    tpf = hh * ww
    grid = space_grid(cfg, n, hh, ww, x.device)
    h = tok.flatten(2).transpose(1, 2)  # (1, N*T, dim)
    e = model.time_embedding(timestep_embedding(cfg.freq_dim, t).float())  # (N, dim)
    e6 = model.time_projection(e).view(1, n, 6, cfg.dim)
    for i, blk in enumerate(model.blocks):
        m = (blk.modulation.unsqueeze(1) + e6).unbind(2)  # 6 x (1, N, dim)
        s1, c1, g1, s2, c2, g2 = (v.unsqueeze(2) for v in m)  # (1, N, 1, dim)
        a = (blk.norm1(h).view(1, n, tpf, -1) * (1 + c1) + s1).flatten(1, 2)
        sa = blk.self_attn
        q = rotate(sa.norm_q(sa.q(a)).view(1, n * tpf, cfg.num_heads, -1), grid.cos, grid.sin, cfg.rope_pairs[0])
        k = rotate(sa.norm_k(sa.k(a)).view(1, n * tpf, cfg.num_heads, -1), grid.cos, grid.sin, cfg.rope_pairs[0])
        v = sa.v(a).view(1, n * tpf, cfg.num_heads, -1)
        y = torch.empty_like(q)
        for start in range(0, n, f):
            own = list(range(start, min(start + f, n)))
            frames = visible_frames(cfg, start) + own
            cos, sin = time_angles(cfg, list(range(len(frames))), tpf)
            idx = torch.tensor([g * tpf + j for g in frames for j in range(tpf)])
            rows = slice(start * tpf, (own[-1] + 1) * tpf)
            qc = rotate(q[:, rows], cos[:, -len(own) * tpf:], sin[:, -len(own) * tpf:], 0)
            y[:, rows] = attend(qc, rotate(k[:, idx], cos, sin, 0), v[:, idx], None)
        h = h + (sa.o(y.flatten(2)).view(1, n, tpf, -1) * g1).flatten(1, 2)
        h = h + blk.cross_attn(blk.norm3(h), text.k[i], text.v[i])
        ffn_in = (blk.norm2(h).view(1, n, tpf, -1) * (1 + c2) + s2).flatten(1, 2)
        h = h + (blk.ffn(ffn_in).view(1, n, tpf, -1) * g2).flatten(1, 2)
    out = model.head(h, e.view(1, n, -1), grid)  # (1, N*T, patch_dim)
    out = out.view(1, n, hh, ww, 1, 2, 2, cfg.out_dim).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return out.reshape(1, cfg.out_dim, n, hh * 2, ww * 2)


def full_sequence_chunk(model, done: list[torch.Tensor], noise: torch.Tensor, gen: torch.Generator,
                        text: TextKV) -> torch.Tensor:
    """One chunk through the sampler, each step's prediction from full_forward over
    [the clean chunks so far | x_t]: the reference for ``generate_chunk``."""
    cfg = model.cfg
    steps = cfg.step_timesteps
    x = x0 = noise
    f = noise.shape[2]
    for j, step in enumerate(steps):
        seq = torch.cat([*done, x], 2)
        t = torch.full((seq.shape[2],), cfg.commit_timestep)
        t[-f:] = step
        x0 = to_x0(x, full_forward(model, seq, t, text)[:, :, -f:], step / cfg.num_train_timesteps)
        if j + 1 < len(steps):
            x = add_noise(x0, torch.randn(x.shape, generator=gen), steps[j + 1] / cfg.num_train_timesteps)
    return x0


# ---------------------------------------------------------------------------- equivalence


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(), seed=1)  # chunks of 2, 1 sink, a window of 4


def test_cached_generation_equals_the_full_sequence_forward_after_the_window_rolls(model):
    cfg = model.cfg
    chunks = 6  # 12 frames: the window (4) has rolled twice over, the sink stays
    prompt = torch.randn(1, 6, cfg.text_dim, generator=torch.Generator().manual_seed(5))
    text = model.text_kv(prompt)
    cache = WanKVCache.create(cfg, H, W, slots=1)
    slot = cache.allocate()

    gen = torch.Generator().manual_seed(7)
    cached = []
    for _ in range(chunks):
        noise = torch.randn(1, cfg.in_dim, cfg.chunk_frames, H, W, generator=gen)
        ctx = cache.chunk([slot])
        cached.append(generate_chunk(model, ctx, text, noise, gen))
    assert cache.frame_at[slot].tolist() == [0, 9, 10, 11, 8]  # sink, then the ring

    gen = torch.Generator().manual_seed(7)
    full: list[torch.Tensor] = []
    for _ in range(chunks):  # the same draws in the same order: the noise, then one per renoise
        noise = torch.randn(1, cfg.in_dim, cfg.chunk_frames, H, W, generator=gen)
        full.append(full_sequence_chunk(model, full, noise, gen, text))
    for c, (a, b) in enumerate(zip(cached, full, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"chunk {c}")

    # the commit passes, replayed: one forward over every clean frame at t = 0
    seq = torch.cat(cached, 2)
    expected = full_forward(model, seq, torch.zeros(seq.shape[2]), text)
    cache2 = WanKVCache.create(cfg, H, W, slots=1)
    slot2 = cache2.allocate()
    for c, x0 in enumerate(cached):
        got = model.commit(x0, text, cache2.chunk([slot2]))
        sl = slice(c * cfg.chunk_frames, (c + 1) * cfg.chunk_frames)
        torch.testing.assert_close(got, expected[:, :, sl], atol=1e-4, rtol=1e-4, msg=f"commit {c}")


def test_a_batch_of_sessions_at_different_fill_levels_equals_each_alone(model):
    """Two sessions in one forward, one joined later (its cache holds fewer frames: the masked
    path), each with its own prompt, slot, and per-frame timesteps."""
    cfg, f = model.cfg, model.cfg.chunk_frames
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randn(4, cfg.text_dim, generator=gen), torch.randn(7, cfg.text_dim, generator=gen)]
    texts = [model.text_kv([p]) for p in prompts]
    batched = WanKVCache.create(cfg, H, W, slots=3)
    alone = WanKVCache.create(cfg, H, W, slots=2)
    b_slots = [batched.allocate(), batched.allocate(), batched.allocate()][1:]  # slots 1, 2
    a_slots = [alone.allocate(), alone.allocate()]

    def chunk_inputs():
        x = torch.randn(2, cfg.in_dim, f, H, W, generator=gen)
        t = torch.tensor([[1000.0, 937.5], [625.0, 833.3]])
        x0 = torch.randn(2, cfg.in_dim, f, H, W, generator=gen)
        return x, t, x0

    for _ in range(2):  # session 0 alone first
        x, t, x0 = chunk_inputs()
        model.commit(x0[:1], texts[0], batched.chunk(b_slots[:1]))
        model.commit(x0[:1], texts[0], alone.chunk(a_slots[:1]))
    both = TextKV.cat(texts)
    for c in range(5):
        x, t, x0 = chunk_inputs()
        ctx = batched.chunk(b_slots)
        assert (ctx.mask is not None) == (c < 3), c  # session 1 fills its 5 frames in 3 chunks
        got = model.denoise(x, t, both, ctx)
        for row in range(2):
            solo = alone.chunk([a_slots[row]])
            want = model.denoise(x[row:row + 1], t[row:row + 1], texts[row], solo)
            torch.testing.assert_close(got[row:row + 1], want, atol=1e-5, rtol=1e-5, msg=f"chunk {c}, row {row}")
            model.commit(x0[row:row + 1], texts[row], solo)
        model.commit(x0, both, ctx)


def test_cache_memory_and_positions_stay_constant_over_many_chunks(model):
    cfg = model.cfg
    cache = WanKVCache.create(cfg, H, W, slots=2)
    slot = cache.allocate()
    text = model.text_kv(torch.randn(1, 3, cfg.text_dim))
    buffers = [(t.data_ptr(), t.shape) for t in (cache.k, cache.v, cache.latents)]
    nbytes = cache.nbytes()
    gen = torch.Generator().manual_seed(0)
    bound = cfg.sink_frames + cfg.window_frames + cfg.chunk_frames
    for c in range(40):
        ctx = cache.chunk([slot])
        assert ctx.rope_positions.max() < bound, (c, ctx.rope_positions)
        assert ctx.start_frames[0] == c * cfg.chunk_frames
        model.commit(torch.randn(1, cfg.in_dim, cfg.chunk_frames, H, W, generator=gen), text, ctx)
    assert [(t.data_ptr(), t.shape) for t in (cache.k, cache.v, cache.latents)] == buffers
    assert cache.nbytes() == nbytes
    frames, latents = cache.held(slot)
    assert frames.tolist() == [0, 76, 77, 78, 79]  # the sink and the last window_frames
    assert latents.shape == (cfg.in_dim, 5, H, W)


def commit_frames(model, cache, slot, latents, frames, text):
    """Commit clean frames into a fresh slot, grouped by chunk as they were generated."""
    for g in sorted(set(f // model.cfg.chunk_frames for f in frames)):
        sel = [i for i, f in enumerate(frames) if f // model.cfg.chunk_frames == g]
        cache.seek(slot, frames[sel[0]])
        model.commit(latents[None, :, sel], text, cache.chunk([slot], num_frames=len(sel)))


def cached_kv(cache, slot):
    ctx = cache.chunk([slot])
    return [torch.cat(cache.read(layer, ctx)) for layer in range(cache.cfg.num_layers)]


def test_recache_under_a_new_prompt_equals_committing_under_it_from_the_start(model):
    cfg = model.cfg
    gen = torch.Generator().manual_seed(2)
    old = model.text_kv(torch.randn(1, 5, cfg.text_dim, generator=gen))
    new = model.text_kv(torch.randn(1, 5, cfg.text_dim, generator=gen))
    cache = WanKVCache.create(cfg, H, W, slots=2)
    a, b = cache.allocate(), cache.allocate()
    for _ in range(2):  # 4 frames: the window has not rolled
        x0 = torch.randn(1, cfg.in_dim, cfg.chunk_frames, H, W, generator=gen)
        model.commit(x0, old, cache.chunk([a]))
        model.commit(x0, new, cache.chunk([b]))
    before = cached_kv(cache, a)
    frames, latents = cache.held(a)
    model.recache(cache, a, latents, frames, new)
    for layer, (x, y, z) in enumerate(zip(cached_kv(cache, a), cached_kv(cache, b), before, strict=True)):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5, msg=f"layer {layer}")
        if layer > 0:  # layer 0's keys come before any cross-attention
            assert not torch.allclose(x, z, atol=1e-3), f"layer {layer}: the prompt changed nothing"
    assert cache.next_frame[a] == cache.next_frame[b] == 4


def test_recache_after_the_window_rolled_equals_a_fresh_cache_of_the_same_frames(model):
    cfg = model.cfg
    gen = torch.Generator().manual_seed(3)
    old = model.text_kv(torch.randn(1, 5, cfg.text_dim, generator=gen))
    new = model.text_kv(torch.randn(1, 5, cfg.text_dim, generator=gen))
    cache = WanKVCache.create(cfg, H, W, slots=2)
    a = cache.allocate()
    for _ in range(5):
        model.commit(torch.randn(1, cfg.in_dim, cfg.chunk_frames, H, W, generator=gen), old, cache.chunk([a]))
    frames, latents = cache.held(a)
    assert frames.tolist() == [0, 6, 7, 8, 9]
    model.recache(cache, a, latents, frames, new)
    b = cache.allocate()
    commit_frames(model, cache, b, latents, frames.tolist(), new)
    for layer, (x, y) in enumerate(zip(cached_kv(cache, a), cached_kv(cache, b), strict=True)):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6, msg=f"layer {layer}")
    assert cache.held(a)[0].tolist() == frames.tolist() and cache.next_frame[a] == 10
    torch.testing.assert_close(cache.held(a)[1], latents)
    x = torch.randn(1, cfg.in_dim, cfg.chunk_frames, H, W, generator=gen)
    t = torch.full((1,), 937.5)
    torch.testing.assert_close(model.denoise(x, t, new, cache.chunk([a])), model.denoise(x, t, new, cache.chunk([b])))


# ---------------------------------------------------------------------------- errors


def test_bad_chunks_are_refused_with_the_indices_named(model):
    cfg = model.cfg
    cache = WanKVCache.create(cfg, H, W, slots=2)
    text = model.text_kv(torch.randn(1, 3, cfg.text_dim))
    a = cache.allocate()
    with pytest.raises(ValueError, match=r"batch row 0: slot 0 expects frame 0 next, not frame 2"):
        cache.chunk([a], [2])
    with pytest.raises(ValueError, match=r"slot 1 is not allocated"):
        cache.chunk([a, 1])
    with pytest.raises(ValueError, match=r"distinct slots, got \[0, 0\]"):
        cache.chunk([a, a])
    ctx = cache.chunk([a])
    with pytest.raises(ValueError, match=r"latents \(1, 4, 2, 4, 8\) do not match the chunk: \(1, 4, 2, 4, 6\)"):
        model.denoise(torch.zeros(1, cfg.in_dim, 2, H, 8), torch.zeros(1), text, ctx)
    with pytest.raises(ValueError, match=r"text K/V holds 2 prompts for a batch of 1"):
        model.denoise(torch.zeros(1, cfg.in_dim, 2, H, W), torch.zeros(1), TextKV.cat([text, text]), ctx)
    with pytest.raises(ValueError, match=r"timesteps \(1, 3\)"):
        model.denoise(torch.zeros(1, cfg.in_dim, 2, H, W), torch.zeros(1, 3), text, ctx)
    with pytest.raises(ValueError, match=r"prompt 0: embedding \(3, 5\)"):
        model.text_kv(torch.zeros(1, 3, 5))
    with pytest.raises(ValueError, match=r"slot 0: frame ids \[3, 2\] are not ascending"):
        model.recache(cache, a, torch.zeros(cfg.in_dim, 2, H, W), [3, 2], text)
    cache.allocate()
    with pytest.raises(CacheFull, match="all 2 slots"):
        cache.allocate()
    cache.release(a)
    with pytest.raises(ValueError, match="slot 0 is not allocated"):
        cache.release(a)


# ---------------------------------------------------------------------------- config


WAN_1_3B_CONFIG = {  # Wan2.1-T2V-1.3B's config.json as published
    "_class_name": "WanModel", "_diffusers_version": "0.30.0", "dim": 1536, "eps": 1e-06, "ffn_dim": 8960,
    "freq_dim": 256, "in_dim": 16, "model_type": "t2v", "num_heads": 12, "num_layers": 30, "out_dim": 16,
    "text_len": 512,
}


def test_config_reads_the_authors_and_diffusers_key_names(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(WAN_1_3B_CONFIG))
    assert WanConfig.from_json(path) == WanConfig.wan_1_3b()
    assert WanConfig.from_json(path).head_dim == 128 and WanConfig.wan_1_3b().rope_pairs == (22, 21, 21)
    diffusers = {"num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16, "out_channels": 16,
                 "ffn_dim": 8960, "freq_dim": 256, "num_layers": 30, "text_dim": 4096, "eps": 1e-6,
                 "patch_size": [1, 2, 2], "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads"}
    assert WanConfig.from_dict(diffusers, qk_norm=True) == WanConfig.wan_1_3b()
    recipe = WanConfig.from_dict({**WAN_1_3B_CONFIG, "denoising_step_list": [1000, 750, 500, 250, 0],
                                  "warp_denoising_step": True, "num_frame_per_block": 3, "sink_size": 3,
                                  "local_attn_size": 12, "timestep_shift": 5.0})
    assert recipe.timesteps == (1000.0, 750.0, 500.0, 250.0) and recipe.window_frames == 6
    assert recipe.step_timesteps == pytest.approx((1000.0, 937.5, 833.333333, 625.0))


def test_config_refuses_bad_values_quoting_them(tmp_path):
    with pytest.raises(ValueError, match="dim 100 is not divisible by num_heads 12"):
        WanConfig(dim=100)
    with pytest.raises(ValueError, match="window_frames must be >= 1, got 0"):
        WanConfig(window_frames=0)
    with pytest.raises(ValueError, match=r"timesteps \(1000.0, 1200.0\): 1200.0 is outside"):
        WanConfig(timesteps=(1000.0, 1200.0))
    with pytest.raises(FileNotFoundError, match=r"nowhere\.json"):
        WanConfig.from_json(tmp_path / "nowhere.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**WAN_1_3B_CONFIG, "num_heads": 7}))
    with pytest.raises(ValueError, match=r"bad.json: .*num_heads 7"):
        WanConfig.from_json(bad)


# ---------------------------------------------------------------------------- LongLive's prompt switch


@torch.no_grad()
def joint_kv(model, x: torch.Tensor, text: TextKV, sinks: list[tuple[torch.Tensor, torch.Tensor]] | None):
    """LongLive's re-cache pass written out: every frame of x (1, C, N, H, W) at timestep 0
    attends to the sinks' stored keys/values (``sinks``: per layer, space-rotated, or None)
    and to all N frames, time positions by rank. Returns each layer's (k, v) of the N frames
    as the cache stores them (k after norm_k, rotated in space only)."""
    cfg = model.cfg
    n = x.shape[2]
    tok = model.patch_embedding(x)
    hh, ww = tok.shape[3:]
    tpf = hh * ww
    grid = space_grid(cfg, n, hh, ww, x.device)
    h = tok.flatten(2).transpose(1, 2)
    e = model.time_embedding(timestep_embedding(cfg.freq_dim, torch.zeros(n)).float())
    e6 = model.time_projection(e).view(1, n, 6, cfg.dim)
    held = 0 if sinks is None else sinks[0][0].shape[1] // tpf
    cos, sin = time_angles(cfg, list(range(held + n)), tpf)
    out = []
    for i, blk in enumerate(model.blocks):
        s1, c1, g1, s2, c2, g2 = (v.unsqueeze(2) for v in (blk.modulation.unsqueeze(1) + e6).unbind(2))
        a = (blk.norm1(h).view(1, n, tpf, -1) * (1 + c1) + s1).flatten(1, 2)
        sa = blk.self_attn
        q = rotate(sa.norm_q(sa.q(a)).view(1, n * tpf, cfg.num_heads, -1), grid.cos, grid.sin, cfg.rope_pairs[0])
        k = rotate(sa.norm_k(sa.k(a)).view(1, n * tpf, cfg.num_heads, -1), grid.cos, grid.sin, cfg.rope_pairs[0])
        v = sa.v(a).view(1, n * tpf, cfg.num_heads, -1)
        out.append((k, v))
        ks, vs = (k, v) if sinks is None else (torch.cat((sinks[i][0], k), 1), torch.cat((sinks[i][1], v), 1))
        qt = rotate(q, cos[:, held * tpf:], sin[:, held * tpf:], 0)
        y = attend(qt, rotate(ks, cos, sin, 0), vs, None)
        h = h + (sa.o(y.flatten(2)).view(1, n, tpf, -1) * g1).flatten(1, 2)
        h = h + blk.cross_attn(blk.norm3(h), text.k[i], text.v[i])
        ffn_in = (blk.norm2(h).view(1, n, tpf, -1) * (1 + c2) + s2).flatten(1, 2)
        h = h + (blk.ffn(ffn_in).view(1, n, tpf, -1) * g2).flatten(1, 2)
    return out


@pytest.mark.parametrize("chunks", [3, 6])  # 6 frames: all within the first span; 12: past it, the sinks kept
def test_longlive_s_prompt_switch_keeps_the_old_sinks_and_recomputes_the_window_in_one_pass(model, chunks):
    cfg = model.cfg
    gen = torch.Generator().manual_seed(7)
    old = model.text_kv(torch.randn(1, 5, cfg.text_dim, generator=gen))
    new = model.text_kv(torch.randn(1, 5, cfg.text_dim, generator=gen))
    cache = WanKVCache.create(cfg, H, W, slots=1)
    slot = cache.allocate()
    lat = []
    for _ in range(chunks):
        x0 = torch.randn(1, cfg.in_dim, cfg.chunk_frames, H, W, generator=gen)
        model.commit(x0, old, cache.chunk([slot]))
        lat.append(x0)
    latents = torch.cat(lat, 2)[0]  # (C, n, H, W)
    n, s, k, t = latents.shape[1], cfg.sink_frames, cfg.window_frames, cache.tokens_per_frame
    keep = n > s + k + cfg.chunk_frames  # LongLive: the re-cache starts past frame 0
    ids = list(range(n - (k + cfg.chunk_frames if keep else n), n))
    sinks_before = [(cache.k[i, slot, :s * t][None].clone(), cache.v[i, slot, :s * t][None].clone())
                    for i in range(cfg.num_layers)]
    model.recache_jointly(cache, slot, latents[:, ids], ids, new, keep)
    want = joint_kv(model, latents[None, :, ids], new, sinks_before if keep else None)
    held = [*range(s), *ids[-k:]] if keep else [*range(s), *[g for g in ids[-k:] if g >= s]]
    assert sorted(cache.frame_at[slot][cache.frame_at[slot] >= 0].tolist()) == held and cache.next_frame[slot] == n
    for layer, (kk, vv) in enumerate(want):
        for g in held:
            pos = cache.position(g)
            got_k, got_v = cache.k[layer, slot, pos * t:(pos + 1) * t], cache.v[layer, slot, pos * t:(pos + 1) * t]
            if keep and g < s:  # the sinks as the old prompt left them
                assert torch.equal(got_k, sinks_before[layer][0][0, g * t:(g + 1) * t]), f"layer {layer} sink {g}"
                continue
            j = ids.index(g)
            torch.testing.assert_close(got_k, kk[0, j * t:(j + 1) * t], atol=1e-5, rtol=1e-5, msg=f"k {layer} {g}")
            torch.testing.assert_close(got_v, vv[0, j * t:(j + 1) * t], atol=1e-5, rtol=1e-5, msg=f"v {layer} {g}")
