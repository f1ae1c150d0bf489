"""Matrix-Game 2.0 on the Wan causal backbone at a tiny random size: the cached chunk-by-chunk
generation with keyboard and mouse equals a full block-causal forward; checkpoints with the
authors' parameter names and shapes load through model/wan/weights.py; the published
config's names give the published shapes; the server's keys reach the action modules frame by
frame; the action mapping of each variant.

The full forward below is written from the authors' training path (every frame at once,
block-causal masks over a local window, absolute RoPE positions), not from the cached code.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.model.wan.tiny import LATENT_HEIGHT as H
from tests.model.wan.tiny import LATENT_WIDTH as W
from tests.model.wan.tiny import random_model
from worldserve.model.attention import attend
from worldserve.model.wan.action import (
    ActionHistory,
    ActionKVCache,
    action_rotation,
    map_actions,
    pixel_frames_of,
)
from worldserve.model.wan.cache import WanKVCache, rope_frequencies, rotate
from worldserve.model.wan.causal import CausalWanModel, TextKV, space_grid, timestep_embedding
from worldserve.model.wan.config import ActionConfig, WanConfig
from worldserve.model.wan.sampler import add_noise, generate_chunk, to_x0
from worldserve.model.wan.weights import WeightsError, load_model


def tiny_mg(**kw) -> WanConfig:
    return WanConfig.tiny_matrix_game(**kw)


@pytest.fixture(scope="module")
def model() -> CausalWanModel:
    return random_model(tiny_mg(), seed=3)  # chunks of 2, no sinks, a window of 2: 4 frames attended


def random_actions(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Keyboard (n, 4) multi-hot and mouse (n, 2) per pixel frame, changing every few frames."""
    rng = np.random.default_rng(seed)
    kb = (rng.random((n, 4)) > 0.6).astype(np.float32)
    ms = (rng.standard_normal((n, 2)) * 0.1).astype(np.float32)
    return kb, ms


def condition(cfg: WanConfig, frames: int, seed: int) -> torch.Tensor:
    """(1, cond_dim, N, H, W): mask 1 on frame 0, then a random 'image latent' per frame."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(1, 4, frames, H, W)
    mask[:, :, 0] = 1
    return torch.cat((mask, torch.randn(1, cfg.out_dim, frames, H, W, generator=g)), 1)


# ---------------------------------------------------------------------------- the full forward


def windows(a: ActionConfig, kb: np.ndarray, ms: np.ndarray, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' grouping: pad 12 copies of action 0 in front, latent frame g takes padded
    actions 4g .. 4g + 11."""
    w = a.window_pixel_frames
    pk = np.concatenate((np.repeat(kb[:1], w, 0), kb))
    pm = np.concatenate((np.repeat(ms[:1], w, 0), ms))
    r = a.vae_time_compression_ratio
    return (torch.from_numpy(np.stack([pk[r * g:r * g + w] for g in range(frames)])),
            torch.from_numpy(np.stack([pm[r * g:r * g + w] for g in range(frames)])))


def action_angles(a: ActionConfig, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = action_rotation(a, np.asarray([positions]), "cpu")
    return cos, sin  # (1, N, 1, Pa)


@torch.no_grad()
def full_action(m, h: torch.Tensor, n: int, tpf: int, kb: torch.Tensor, ms: torch.Tensor,
                attended: int, f: int) -> torch.Tensor:
    """The action module over the whole sequence h (1, N*T, dim): each chunk's frames attend to
    the frames [chunk end - attended, chunk end), RoPE at absolute frame positions."""
    a = m.cfg
    heads = a.heads_num
    # mouse, per token over time
    tokens = h.view(1, n, tpf, -1).transpose(1, 2)[0]  # (T, N, dim)
    z = m.mouse_mlp(torch.cat((tokens, ms.flatten(1)[None].expand(tpf, n, -1).to(h.dtype)), -1))
    q, k, v = m.t_qkv(z).view(tpf, n, 3, heads, -1).unbind(2)  # (T, N, H, D)
    q, k = m.img_attn_q_norm(q), m.img_attn_k_norm(k)
    y = torch.empty_like(q)
    for start in range(0, n, f):
        own = list(range(start, min(start + f, n)))
        seen = list(range(max(0, own[-1] + 1 - attended), own[-1] + 1))
        cq, sq = action_angles(a, own)
        ck, sk = action_angles(a, seen)
        y[:, own] = attend(rotate(q[:, own], cq, sq, 0), rotate(k[:, seen], ck, sk, 0), v[:, seen], None)
    h = h + m.proj_mouse(y.transpose(0, 1).reshape(1, n * tpf, -1))
    # keyboard, one key per frame
    keys = m.keyboard_embed(kb.to(h.dtype))  # (N, W, hidden)
    k, v = m.keyboard_attn_kv(keys.flatten(1)).view(n, 2, heads, -1).unbind(1)  # (N, H, D)
    k = m.key_attn_k_norm(k)
    q = m.key_attn_q_norm(m.mouse_attn_q(h).view(n, tpf, heads, -1))  # (N, T, H, D)
    y = torch.empty_like(q)
    for start in range(0, n, f):
        own = list(range(start, min(start + f, n)))
        seen = list(range(max(0, own[-1] + 1 - attended), own[-1] + 1))
        ck, sk = action_angles(a, seen)
        for g in own:
            cq, sq = action_angles(a, [g] * tpf)
            y[g] = attend(rotate(q[g][None], cq, sq, 0), rotate(k[seen][None], ck, sk, 0), v[seen][None], None)[0]
    return h + m.proj_keyboard(y.reshape(1, n * tpf, -1))


@torch.no_grad()
def full_forward(model, x: torch.Tensor, cond: torch.Tensor, t: torch.Tensor, ctx_kv, kb, ms) -> torch.Tensor:
    """Flow prediction of every frame of x (1, C, N, H, W), the whole sequence at once."""
    cfg = model.cfg
    n, f = x.shape[2], cfg.chunk_frames
    attended = cfg.window_frames + f
    tok = model.patch_embedding(torch.cat((x, cond[:, :, :n]), 1))
    hh, ww = tok.shape[3:]
    tpf = hh * ww
    grid = space_grid(cfg, n, hh, ww, x.device)
    h = tok.flatten(2).transpose(1, 2)
    e = model.time_embedding(timestep_embedding(cfg.freq_dim, t).float())
    e6 = model.time_projection(e).view(1, n, 6, cfg.dim)
    inv = rope_frequencies(cfg, cfg.rope_pairs[0])
    for i, blk in enumerate(model.blocks):
        s1, c1, g1, s2, c2, g2 = (v.unsqueeze(2) for v in (blk.modulation.unsqueeze(1) + e6).unbind(2))
        a_ = (blk.norm1(h).view(1, n, tpf, -1) * (1 + c1) + s1).flatten(1, 2)
        sa = blk.self_attn
        q = rotate(sa.norm_q(sa.q(a_)).view(1, n * tpf, cfg.num_heads, -1), grid.cos, grid.sin, cfg.rope_pairs[0])
        k = rotate(sa.norm_k(sa.k(a_)).view(1, n * tpf, cfg.num_heads, -1), grid.cos, grid.sin, cfg.rope_pairs[0])
        v = sa.v(a_).view(1, n * tpf, cfg.num_heads, -1)
        y = torch.empty_like(q)
        for start in range(0, n, f):
            own = list(range(start, min(start + f, n)))
            seen = list(range(max(0, own[-1] + 1 - attended), own[-1] + 1))
            ang = torch.tensor(seen, dtype=torch.float64).repeat_interleave(tpf)[:, None] * inv  # absolute positions
            cos, sin = ang.cos().float()[None, :, None], ang.sin().float()[None, :, None]
            idx = torch.tensor([g * tpf + j for g in seen for j in range(tpf)])
            rows = slice(start * tpf, (own[-1] + 1) * tpf)
            qc = rotate(q[:, rows], cos[:, -len(own) * tpf:], sin[:, -len(own) * tpf:], 0)
            y[:, rows] = attend(qc, rotate(k[:, idx], cos, sin, 0), v[:, idx], None)
        h = h + (sa.o(y.flatten(2)).view(1, n, tpf, -1) * g1).flatten(1, 2)
        h = h + blk.cross_attn(blk.norm3(h), ctx_kv.k[i], ctx_kv.v[i])
        if blk.action_model is not None:
            h = full_action(blk.action_model, h, n, tpf, kb[:n], ms[:n], attended, f)
        ffn_in = (blk.norm2(h).view(1, n, tpf, -1) * (1 + c2) + s2).flatten(1, 2)
        h = h + (blk.ffn(ffn_in).view(1, n, tpf, -1) * g2).flatten(1, 2)
    out = model.head(h, e.view(1, n, -1), grid)
    out = out.view(1, n, hh, ww, 1, 2, 2, cfg.out_dim).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return out.reshape(1, cfg.out_dim, n, hh * 2, ww * 2)


# ---------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("recipe, held", [
    ({}, [8, 9]),  # chunks of 2 reading 2 frames before: the 4-frame attention window has rolled 3 times
    ({"chunk_frames": 3, "window_frames": 1}, [12, 13, 14]),  # gta_drive's: 1 frame before a chunk of 3
])
def test_cached_generation_with_keys_and_mouse_equals_the_full_block_causal_forward(model, recipe, held):
    if recipe:
        model = random_model(tiny_mg(**recipe), seed=3)
    cfg, a = model.cfg, model.cfg.action_config
    chunks, f = 5, model.cfg.chunk_frames
    frames = chunks * f
    kb, ms = random_actions(1 + 4 * (frames - 1), seed=4)
    kbw, msw = windows(a, kb, ms, frames)  # (N, 12, dim) by the authors' indexing
    cond = condition(cfg, frames, seed=5)
    image = model.image_kv(torch.randn(1, 7, cfg.image_dim, generator=torch.Generator().manual_seed(6)))

    pool = WanKVCache.create(cfg, H, W, slots=2)
    actions = ActionKVCache.create(cfg, pool)
    slot = pool.allocate()
    history = ActionHistory.empty(a)
    gen = torch.Generator().manual_seed(7)
    cached = []
    for c in range(chunks):
        s = c * f
        first, count = pixel_frames_of(s, f)
        history.extend(kb[first:first + count], ms[first:first + count], keep=64)
        k_win, m_win = history.windows(s, f)
        np.testing.assert_array_equal(k_win, kbw[s:s + f].numpy())  # the history gives the authors' windows
        ctx = pool.chunk([slot])
        act = actions.chunk(ctx, torch.from_numpy(k_win)[None], torch.from_numpy(m_win)[None])
        noise = torch.randn(1, cfg.out_dim, f, H, W, generator=gen)
        cached.append(generate_chunk(model, ctx, image, noise, gen, cond=cond[:, :, s:s + f], act=act))

    gen = torch.Generator().manual_seed(7)
    steps = cfg.step_timesteps
    done: list[torch.Tensor] = []
    for c in range(chunks):
        x = x0 = torch.randn(1, cfg.out_dim, f, H, W, generator=gen)
        for j, step in enumerate(steps):
            seq = torch.cat([*done, x], 2)
            t = torch.full((seq.shape[2],), cfg.commit_timestep)
            t[-f:] = step
            pred = full_forward(model, seq, cond, t, image, kbw, msw)[:, :, -f:]
            x0 = to_x0(x, pred, step / cfg.num_train_timesteps)
            if j + 1 < len(steps):
                x = add_noise(x0, torch.randn(x.shape, generator=gen), steps[j + 1] / cfg.num_train_timesteps)
        torch.testing.assert_close(cached[c], x0, atol=1e-4, rtol=1e-4, msg=f"chunk {c}")
        done.append(x0)
    assert pool.frame_at[slot].tolist() == held  # a rolling ring, no sinks


def test_a_batch_of_two_sessions_with_different_keys_equals_each_alone(model):
    cfg, a, f = model.cfg, model.cfg.action_config, model.cfg.chunk_frames
    pool = WanKVCache.create(cfg, H, W, slots=4)
    actions = ActionKVCache.create(cfg, pool)
    both, solo = [pool.allocate(), pool.allocate()], [pool.allocate(), pool.allocate()]
    g = torch.Generator().manual_seed(9)
    images = [model.image_kv(torch.randn(1, 5, cfg.image_dim, generator=g)) for _ in range(2)]
    conds = [condition(cfg, 8, seed=10 + i) for i in range(2)]
    hist = [ActionHistory.empty(a) for _ in range(2)]
    acts = [random_actions(64, seed=20 + i) for i in range(2)]
    for c in range(3):
        s = c * f
        first, count = pixel_frames_of(s, f)
        wins = []
        for i in range(2):
            hist[i].extend(acts[i][0][first:first + count], acts[i][1][first:first + count], keep=64)
            wins.append([torch.from_numpy(w)[None] for w in hist[i].windows(s, f)])
        x = torch.randn(2, cfg.out_dim, f, H, W, generator=g)
        x0 = torch.randn(2, cfg.out_dim, f, H, W, generator=g)
        t = torch.tensor([[1000.0, 900.0], [500.0, 400.0]])
        ctx = pool.chunk(both)
        act = actions.chunk(ctx, torch.cat([w[0] for w in wins]), torch.cat([w[1] for w in wins]))
        cond = torch.cat([cd[:, :, s:s + f] for cd in conds])
        got = model.denoise(x, t, TextKV.cat(images), ctx, cond, act)
        model.commit(x0, TextKV.cat(images), ctx, cond, act)
        for i in range(2):
            ctx1 = pool.chunk([solo[i]])
            act1 = actions.chunk(ctx1, *wins[i])
            cd = conds[i][:, :, s:s + f]
            want = model.denoise(x[i:i + 1], t[i:i + 1], images[i], ctx1, cd, act1)
            torch.testing.assert_close(got[i:i + 1], want, atol=1e-5, rtol=1e-5, msg=f"chunk {c} row {i}")
            model.commit(x0[i:i + 1], images[i], ctx1, cd, act1)


# ---------------------------------------------------------------------------- the actions reach the model


def test_a_held_key_reaches_the_keyboard_module_at_the_latent_frames_whose_window_holds_it(model):
    """Forward held from pixel frame 9 on: latent frame g's window is pixel frames 4g-12 .. 4g-1,
    so frames 0..2 see no key, frame 3 (pixels 0..11) sees it in its last 3 rows, frame 4 in its
    last 7; and the prediction of a chunk changes with the key."""
    cfg, a, f = model.cfg, model.cfg.action_config, model.cfg.chunk_frames
    n_pixels = 1 + 4 * (6 - 1)
    kb = np.zeros((n_pixels, 4), np.float32)
    kb[9:, 0] = 1  # forward from pixel frame 9
    ms = np.zeros((n_pixels, 2), np.float32)
    seen: list[torch.Tensor] = []
    embed = model.blocks[0].action_model.keyboard_embed
    hook = embed.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    try:
        pool = WanKVCache.create(cfg, H, W, slots=1)
        actions = ActionKVCache.create(cfg, pool)
        slot = pool.allocate()
        hist = ActionHistory.empty(a)
        image = model.image_kv(torch.randn(1, 5, cfg.image_dim))
        cond = condition(cfg, 6, seed=1)
        outs = {}
        for c in range(3):
            s = c * f
            first, count = pixel_frames_of(s, f)
            hist.extend(kb[first:first + count], ms[first:first + count], keep=64)
            ctx = pool.chunk([slot])
            act = actions.chunk(ctx, *(torch.from_numpy(w)[None] for w in hist.windows(s, f)))
            seen.clear()
            x = torch.randn(1, cfg.out_dim, f, H, W, generator=torch.Generator().manual_seed(c))
            outs[c] = model.denoise(x, torch.full((1,), 666.0), image, ctx, cond[:, :, s:s + f], act)
            windows_in = seen[0][0]  # (F, 12, 4) the chunk's windows as the module got them
            held = windows_in[..., 0].sum(1).tolist()
            assert held == [float(max(0, 4 * g - 9)) for g in range(s, s + f)], (c, held)
            # the same chunk with no key held anywhere: another prediction
            if c == 2:
                quiet = ActionHistory.empty(a)
                quiet.extend(np.zeros_like(kb[:first + count]), ms[:first + count], keep=64)
                act0 = actions.chunk(pool.chunk([slot]), *(torch.from_numpy(w)[None] for w in quiet.windows(s, f)))
                still = model.denoise(x, torch.full((1,), 666.0), image, pool.chunk([slot]), cond[:, :, s:s + f], act0)
                assert (still - outs[c]).abs().max() > 1e-3
            model.commit(outs[c], image, ctx, cond[:, :, s:s + f], act)
    finally:
        hook.remove()


def test_the_mouse_moves_the_prediction_and_a_model_without_actions_refuses_a_chunk_without_them(model):
    cfg, a, f = model.cfg, model.cfg.action_config, model.cfg.chunk_frames
    pool = WanKVCache.create(cfg, H, W, slots=1)
    actions = ActionKVCache.create(cfg, pool)
    slot = pool.allocate()
    image = model.image_kv(torch.randn(1, 5, cfg.image_dim))
    cond = condition(cfg, f, seed=2)
    x = torch.randn(1, cfg.out_dim, f, H, W)
    kb = torch.zeros(1, f, a.window_pixel_frames, 4)
    still = torch.zeros(1, f, a.window_pixel_frames, 2)
    turn = still.clone()
    turn[..., 1] = 0.1  # yaw right
    ctx = pool.chunk([slot])
    v0 = model.denoise(x, torch.full((1,), 666.0), image, ctx, cond, actions.chunk(ctx, kb, still))
    v1 = model.denoise(x, torch.full((1,), 666.0), image, ctx, cond, actions.chunk(ctx, kb, turn))
    assert (v0 - v1).abs().max() > 1e-3
    with pytest.raises(ValueError, match="block 0 has an action module and the chunk came without actions"):
        model.denoise(x, torch.full((1,), 666.0), image, ctx, cond)
    with pytest.raises(ValueError, match=r"image condition None, expected \(1, 8, 2, 4, 6\)"):
        model.denoise(x, torch.full((1,), 666.0), image, ctx)
    with pytest.raises(ValueError, match=r"keyboard windows \(1, 2, 12, 3\), expected \(1, 2, 12, 4\)"):
        actions.chunk(ctx, torch.zeros(1, f, 12, 3), still)


# ---------------------------------------------------------------------------- the authors' names and shapes


def authors_parameters(cfg: WanConfig) -> dict[str, tuple[int, ...]]:
    """The state dict of the authors' CausalWanModel (Matrix-Game-2/wan/modules/causal_model.py
    with model.py's MLPProj and action_module.py's ActionModule) for a config, written from
    their module definitions: names and shapes."""
    d, ffn, a = cfg.dim, cfg.ffn_dim, cfg.action_config
    assert a is not None
    out: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (d, cfg.in_dim, *cfg.patch_size), "patch_embedding.bias": (d,),
        "time_embedding.0.weight": (d, cfg.freq_dim), "time_embedding.0.bias": (d,),
        "time_embedding.2.weight": (d, d), "time_embedding.2.bias": (d,),
        "time_projection.1.weight": (6 * d, d), "time_projection.1.bias": (6 * d,),
        "head.modulation": (1, 2, d), "head.head.weight": (cfg.patch_dim, d), "head.head.bias": (cfg.patch_dim,),
        "img_emb.proj.0.weight": (cfg.image_dim,), "img_emb.proj.0.bias": (cfg.image_dim,),
        "img_emb.proj.1.weight": (cfg.image_dim, cfg.image_dim), "img_emb.proj.1.bias": (cfg.image_dim,),
        "img_emb.proj.3.weight": (d, cfg.image_dim), "img_emb.proj.3.bias": (d,),
        "img_emb.proj.4.weight": (d,), "img_emb.proj.4.bias": (d,),
    }
    w, kh, mh, hn = a.window_pixel_frames, a.keyboard_hidden_dim, a.mouse_hidden_dim, a.heads_num
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        out[p + "modulation"] = (1, 6, d)
        for att in ("self_attn", "cross_attn"):
            for lin in "qkvo":
                out[f"{p}{att}.{lin}.weight"], out[f"{p}{att}.{lin}.bias"] = (d, d), (d,)
            out[f"{p}{att}.norm_q.weight"] = out[f"{p}{att}.norm_k.weight"] = (d,)
        out[p + "norm3.weight"] = out[p + "norm3.bias"] = (d,)
        out[p + "ffn.0.weight"], out[p + "ffn.0.bias"] = (ffn, d), (ffn,)
        out[p + "ffn.2.weight"], out[p + "ffn.2.bias"] = (d, ffn), (d,)
        if i in a.blocks:
            m = p + "action_model."
            out |= {
                m + "keyboard_embed.0.weight": (a.hidden_size, a.keyboard_dim_in),
                m + "keyboard_embed.0.bias": (a.hidden_size,),
                m + "keyboard_embed.2.weight": (a.hidden_size, a.hidden_size),
                m + "keyboard_embed.2.bias": (a.hidden_size,),
                m + "key_attn_q_norm.weight": (kh // hn,), m + "key_attn_k_norm.weight": (kh // hn,),
                m + "mouse_attn_q.weight": (kh, d), m + "keyboard_attn_kv.weight": (2 * kh, a.hidden_size * w),
                m + "proj_keyboard.weight": (d, kh),
            }
            if a.enable_mouse:
                out |= {
                    m + "mouse_mlp.0.weight": (mh, a.mouse_dim_in * w + d), m + "mouse_mlp.0.bias": (mh,),
                    m + "mouse_mlp.2.weight": (mh, mh), m + "mouse_mlp.2.bias": (mh,),
                    m + "mouse_mlp.3.weight": (mh,), m + "mouse_mlp.3.bias": (mh,),
                    m + "t_qkv.weight": (3 * mh, mh), m + "img_attn_q_norm.weight": (mh // hn,),
                    m + "img_attn_k_norm.weight": (mh // hn,), m + "proj_mouse.weight": (d, mh),
                }
    return out


# configs/distilled_model/universal/config.json and configs/inference_yaml/inference_universal.yaml
# of SkyworkAI/Matrix-Game (Matrix-Game-2), as published
UNIVERSAL_CONFIG = {
    "_class_name": "CausalWanModel", "_diffusers_version": "0.35.0.dev0",
    "action_config": {
        "blocks": list(range(15)), "enable_keyboard": True, "enable_mouse": True, "heads_num": 16,
        "hidden_size": 128, "img_hidden_size": 1536, "keyboard_dim_in": 4, "keyboard_hidden_dim": 1024,
        "mouse_dim_in": 2, "mouse_hidden_dim": 1024, "mouse_qk_dim_list": [8, 28, 28], "patch_size": [1, 2, 2],
        "qk_norm": True, "qkv_bias": False, "rope_dim_list": [8, 28, 28], "rope_theta": 256,
        "vae_time_compression_ratio": 4, "windows_size": 3,
    },
    "dim": 1536, "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "in_dim": 36, "inject_sample_info": False,
    "local_attn_size": 6, "model_type": "i2v", "num_heads": 12, "num_layers": 30, "out_dim": 16,
    "sink_size": 0, "text_len": 512,
}
UNIVERSAL_INFERENCE = {"denoising_step_list": [1000, 666, 333], "warp_denoising_step": True,
                       "num_frame_per_block": 3, "context_noise": 0, "timestep_shift": 5.0}
# configs/inference_yaml/inference_templerun.yaml: four steps where the other variants take three
TEMPLERUN_INFERENCE = {**UNIVERSAL_INFERENCE, "denoising_step_list": [1000, 750, 500, 250]}
RATE = {"fps": 12.0}  # the recipes' frame rate (utils/visualize.py writes 12 fps); the configs name none


def test_the_published_universal_config_builds_the_published_parameter_shapes():
    cfg = WanConfig.from_dict({**UNIVERSAL_CONFIG, **UNIVERSAL_INFERENCE, **RATE})
    assert cfg == WanConfig.matrix_game_2("universal")
    assert (cfg.chunk_frames, cfg.sink_frames, cfg.window_frames, cfg.cond_dim) == (3, 0, 3, 20)
    assert cfg.step_timesteps == pytest.approx((1000.0, 908.84, 713.98), abs=0.01)
    assert cfg.tokens_per_frame(352 // 8, 640 // 8) == 880
    with torch.device("meta"):
        model = CausalWanModel(cfg)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == authors_parameters(cfg)
    assert sum(1 for b in model.blocks if b.action_model is not None) == 15
    assert got["blocks.0.action_model.mouse_mlp.0.weight"] == (1024, 1560)
    assert got["blocks.14.action_model.keyboard_attn_kv.weight"] == (2048, 1536)
    assert "blocks.15.action_model.t_qkv.weight" not in got and "text_embedding.0.weight" not in got


def test_variants_read_from_their_configs_gta_drive_with_its_one_frame_window():
    templerun = {**UNIVERSAL_CONFIG, "action_config": {**UNIVERSAL_CONFIG["action_config"], "keyboard_dim_in": 7,
                                                       "enable_mouse": False}}
    cfg = WanConfig.from_dict({**templerun, **TEMPLERUN_INFERENCE, **RATE})
    assert cfg == WanConfig.matrix_game_2("templerun")
    with torch.device("meta"):
        names = set(CausalWanModel(cfg).state_dict())
    assert set(authors_parameters(cfg)) == names and not any("mouse_mlp" in n for n in names)
    gta = {**UNIVERSAL_CONFIG, "local_attn_size": 4,
           "action_config": {**UNIVERSAL_CONFIG["action_config"], "keyboard_dim_in": 2}}
    cfg = WanConfig.from_dict({**gta, **UNIVERSAL_INFERENCE, **RATE})
    assert cfg == WanConfig.matrix_game_2("gta_drive")
    assert (cfg.window_frames, cfg.ring_frames, cfg.cache_frames) == (1, 3, 3)  # reads 1, holds the last chunk


def test_a_checkpoint_in_the_authors_names_loads_through_the_weights_path_and_runs_the_same(tmp_path, model):
    """The authors save the generator wrapper's state dict (keys under ``model.``) as safetensors:
    a random one built from their names loads, equals the model it was made from, and a
    missing action key is named."""
    cfg = model.cfg
    state = {"model." + k: v.clone() for k, v in model.state_dict().items()}
    assert {k[len("model."):]: tuple(v.shape) for k, v in state.items()} == authors_parameters(cfg)
    path = tmp_path / "base_distilled_model.safetensors"
    save_file(state, str(path))
    loaded = load_model(path, cfg)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    del state["model.blocks.0.action_model.keyboard_attn_kv.weight"]
    bad = tmp_path / "bad.safetensors"
    save_file(state, str(bad))
    with pytest.raises(WeightsError, match=r"key 'blocks.0.action_model.keyboard_attn_kv.weight' is missing"):
        load_model(bad, cfg)


def test_config_json_round_trips_with_the_action_config(tmp_path):
    cfg = tiny_mg()
    raw = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert WanConfig.from_json(path) == cfg


# ---------------------------------------------------------------------------- the server's actions


def test_the_server_actions_map_to_each_variant_s_action_space():
    # forward+left held, mouse right and up
    vec = np.array([[1, 0, 1, 0, 0.5, -1.0]], np.float32)
    kb, ms = map_actions(WanConfig.matrix_game_2("universal").action_config, vec)
    assert kb.tolist() == [[1, 0, 1, 0]] and ms[0].tolist() == pytest.approx([0.1, 0.05])
    kb, ms = map_actions(ActionConfig(keyboard_dim_in=2), vec)  # gta_drive: W/S, steering from A/D and dx
    assert kb.tolist() == [[1, 0]] and ms[0].tolist() == pytest.approx([0.0, -0.05])
    temple = WanConfig.matrix_game_2("templerun").action_config
    kb, _ = map_actions(temple, np.array([[0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0.2, 0],
                                          [0, 0, 0, 1, 0, 0], [1, 0, 0, 0, -0.9, 0]], np.float32))
    assert kb.argmax(1).tolist() == [0, 1, 2, 6, 3] and kb.sum(1).tolist() == [1] * 5
    with pytest.raises(ValueError, match=r"actions \(3,\), expected \(N, 6\)"):
        map_actions(temple, np.zeros(3, np.float32))


def test_action_history_windows_are_the_authors_grouping_and_refuse_what_it_no_longer_holds():
    a = ActionConfig()
    kb, ms = random_actions(1 + 4 * 9, seed=1)
    hist = ActionHistory.empty(a)
    want_k, want_m = windows(a, kb, ms, 10)
    for s in range(0, 10, 2):
        first, count = pixel_frames_of(s, 2)
        hist.extend(kb[first:first + count], ms[first:first + count], keep=a.window_pixel_frames + 8 + 1)
        k, m = hist.windows(s, 2)
        np.testing.assert_array_equal(k, want_k[s:s + 2].numpy())
        np.testing.assert_array_equal(m, want_m[s:s + 2].numpy())
    with pytest.raises(ValueError, match=r"need pixel frames 0\.\.3; the history holds 16\.\.36"):
        hist.windows(0, 2)
