"""The causal transformer against the authors' reference implementation.

The reference is ``models/wan/causal_model.py`` of ``streamdiffusionv2==0.1.1`` (installed for
tests only, with ``--no-deps``). Its weights go through the real loading path (saved as an
authors' ``.pt`` with ``generator_ema``, loaded by ``model.wan.weights.load_model``), then both
run the same chunks through their KV caches: every denoising step's prediction, the commit
pass's prediction, and the keys the commit leaves in the cache must agree.

How the reference runs on this CPU: its cached forward takes a cache built by hand per block
(``k``, ``v`` of the config's head size, per-row ``global_end_index`` / ``local_end_index``),
per-row ``current_start`` / ``current_end`` tensors, and falls back from flash-attn to SDPA
with a warning, silenced here. Its cache is given room for one chunk more than the test writes:
when a write ends exactly at the end of its buffer, its next call takes the rolling branch,
which needs pipeline state (``total_steps``) that the cached forward alone never sets. The
comparison stays before any window rolls: there, the reference keeps positions absolute and
this model uses rank positions (``model/wan/cache.py``), by design; the rolled regime is checked
against a full-sequence forward in ``test_causal.py``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.model.wan.tiny import random_model, save_checkpoint, tiny_config
from worldserve.model.wan import recipes
from worldserve.model.wan.cache import WanKVCache
from worldserve.model.wan.sampler import generate_chunk
from worldserve.model.wan.weights import load_model

reference = pytest.importorskip("models.wan.causal_model", reason="streamdiffusionv2 (test dependency) not installed")

H, W = 4, 6  # latent frame: 2 x 3 tokens
CHUNKS = 4


def build_reference(cfg):
    return reference.CausalWanModel(
        model_type="t2v", patch_size=cfg.patch_size, text_len=cfg.text_len, in_dim=cfg.in_dim, dim=cfg.dim,
        ffn_dim=cfg.ffn_dim, freq_dim=cfg.freq_dim, text_dim=cfg.text_dim, out_dim=cfg.out_dim,
        num_heads=cfg.num_heads, num_layers=cfg.num_layers, qk_norm=cfg.qk_norm,
        cross_attn_norm=cfg.cross_attn_norm, eps=cfg.eps,
    ).eval()


def reference_caches(cfg, batch: int, tokens: int):
    shape = (batch, tokens, cfg.num_heads, cfg.head_dim)
    kv = [
        dict(k=torch.zeros(shape), v=torch.zeros(shape), global_end_index=torch.zeros(batch, dtype=torch.long),
             local_end_index=torch.zeros(batch, dtype=torch.long))
        for _ in range(cfg.num_layers)
    ]
    cross = [dict(is_init=False, k=None, v=None) for _ in range(cfg.num_layers)]
    return kv, cross


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(config, reference model with random weights, this model loaded from its .pt)."""
    cfg = tiny_config(sink_frames=1, window_frames=CHUNKS * 2 - 1)  # holds every frame: no roll
    ref = build_reference(cfg)
    ref.load_state_dict(random_model(cfg, seed=3).state_dict())
    path = save_checkpoint(ref.state_dict(), tmp_path_factory.mktemp("ref") / "ref.pt", keys=("generator_ema",))
    return cfg, ref, load_model(path, cfg)


def test_weights_of_the_reference_load_by_their_own_names(pair):
    _, ref, mine = pair
    theirs, ours = ref.state_dict(), mine.state_dict()
    assert set(theirs) == set(ours)
    for key, value in theirs.items():
        assert torch.equal(value, ours[key]), key


def test_chunks_through_the_cache_match_the_reference(pair):
    cfg, ref, mine = pair
    b, f = 2, cfg.chunk_frames
    t_tok = (H // 2) * (W // 2)
    prompts = [torch.randn(5, cfg.text_dim), torch.randn(cfg.text_len, cfg.text_dim)]
    kv, cross = reference_caches(cfg, b, (CHUNKS + 1) * f * t_tok)
    cache = WanKVCache.create(cfg, H, W, slots=3)
    cache.allocate()  # a slot in use by someone else: the batch's slots are 1 and 2
    slots = [cache.allocate(), cache.allocate()]
    text = mine.text_kv(prompts)
    gen = torch.Generator().manual_seed(0)
    # per-frame timesteps: the second row's frames at different levels, as stream batching runs them
    steps = [torch.tensor([[1000.0] * f, [1000.0, 937.5]]), torch.full((b, f), 833.33), torch.full((b, f), 625.0)]

    def run_ref(x, t, start):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "flash_attn is not installed; falling back to SDPA"
            return ref(x, t, prompts, seq_len=10**6, kv_cache=kv, crossattn_cache=cross,
                       current_start=start, current_end=start + f * t_tok)

    with torch.no_grad():
        for c in range(CHUNKS):
            ctx = cache.chunk(slots)
            start = torch.full((b,), c * f * t_tok, dtype=torch.long)
            for t in steps:
                x = torch.randn(b, cfg.in_dim, f, H, W, generator=gen)
                expected = run_ref(x, t, start)
                got = mine.denoise(x, t, text, ctx)
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=f"chunk {c}, t {t.tolist()}")
            x0 = torch.randn(b, cfg.in_dim, f, H, W, generator=gen)
            expected = run_ref(x0, torch.zeros(b, f), start)
            got = mine.commit(x0, text, ctx)
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=f"commit of chunk {c}")

            # the keys each layer keeps: the reference stores them rotated by absolute frame,
            # this cache rotates on read by rank, which equals the frame until the window rolls
            read_ctx = cache.chunk(slots)
            held = (c + 1) * f * t_tok
            assert read_ctx.used == held
            for layer in range(cfg.num_layers):
                k, v = cache.read(layer, read_ctx)
                torch.testing.assert_close(k, kv[layer]["k"][:, :held], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(v, kv[layer]["v"][:, :held], atol=1e-5, rtol=1e-5)


def test_a_self_forcing_rollout_of_7_chunks_equals_the_reference_s_global_attention_rollout(tmp_path):
    """Self-Forcing generates 21 latent frames (81 pixel frames), 7 chunks of 3, every chunk
    attending to every frame before it (a cache of 21 frames, no sinks). The recipe served
    (model/wan/recipes.py) through the real loading path, sampled chunk by chunk with the same
    noise, gives the reference's frames; the house's old default (3 sinks and a window of 9)
    departs from latent frame 15 on."""
    recipe = recipes.get("self-forcing")
    cfg = tiny_config(**recipe.config_fields())
    ref = build_reference(cfg)
    ref.load_state_dict(random_model(cfg, seed=5).state_dict())
    path = save_checkpoint(ref.state_dict(), tmp_path / "self_forcing_dmd.pt")
    mine = load_model(path, cfg, key=recipe.checkpoint_key)
    f, t_tok, chunks = cfg.chunk_frames, (H // 2) * (W // 2), 7
    prompt = [torch.randn(cfg.text_len, cfg.text_dim, generator=torch.Generator().manual_seed(0))]
    steps = cfg.step_timesteps
    g = torch.Generator().manual_seed(1)
    first = [torch.randn(1, cfg.out_dim, f, H, W, generator=g) for _ in range(chunks)]  # each chunk's start

    def reference_rollout() -> torch.Tensor:
        kv, cross = reference_caches(cfg, 1, (chunks + 1) * f * t_tok)
        fresh = torch.Generator().manual_seed(2)  # the noise between steps, drawn as the sampler draws it
        out = []
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for c in range(chunks):
                start = torch.tensor([c * f * t_tok])

                def run(x, t, start=start):
                    return ref(x, torch.full((1, f), float(t)), prompt, seq_len=10**6, kv_cache=kv,
                               crossattn_cache=cross, current_start=start, current_end=start + f * t_tok)

                x = first[c]
                for i, t in enumerate(steps):
                    x0 = x - (t / cfg.num_train_timesteps) * run(x, t)
                    if i + 1 < len(steps):
                        s = steps[i + 1] / cfg.num_train_timesteps
                        x = (1 - s) * x0 + s * torch.randn(x.shape, generator=fresh)
                run(x0, 0.0)
                out.append(x0)
        return torch.cat(out, 2)

    def rollout(model) -> torch.Tensor:
        cache = WanKVCache.create(model.cfg, H, W, slots=1)
        slot = cache.allocate()
        text = model.text_kv(prompt)
        fresh = torch.Generator().manual_seed(2)
        return torch.cat([generate_chunk(model, cache.chunk([slot]), text, first[c], generator=fresh)
                          for c in range(chunks)], 2)

    want = reference_rollout()
    torch.testing.assert_close(rollout(mine), want, atol=1e-4, rtol=1e-4)
    old = tiny_config(**{**recipe.config_fields(), "sink_frames": 3, "window_frames": 9})
    frame_err = (rollout(load_model(path, old)) - want).abs().amax(dim=(0, 1, 3, 4))  # (21,) by latent frame
    assert frame_err[:15].max() < 1e-4 and frame_err[15:].min() > 1e-3
