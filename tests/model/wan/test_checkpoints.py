"""The authors' checkpoints as they lie: training wrappers' key segments, the state dict each
recipe serves, memory-mapped reading, LongLive's LoRA merged equal to PEFT's forward and
refused when absent, and the full-size key sets of the published files."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.model.wan.tiny import (
    LATENT_HEIGHT,
    LATENT_WIDTH,
    random_model,
    save_checkpoint,
    tiny_config,
)
from worldserve.model.wan import recipes, weights
from worldserve.model.wan.cache import WanKVCache
from worldserve.model.wan.causal import CausalWanModel
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.layout import check_layout
from worldserve.model.wan.weights import WeightsError, load_model, read_state_dict

peft = pytest.importorskip("peft", reason="peft (test dependency) not installed")


@pytest.fixture(scope="module")
def cfg() -> WanConfig:
    return tiny_config()


@pytest.fixture(scope="module")
def models(cfg):
    return random_model(cfg, seed=0), random_model(cfg, seed=1)


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sb = b.state_dict()
    return all(torch.equal(v, sb[k]) for k, v in a.state_dict().items())


def wrapped(name: str) -> str:
    """A key as FSDP, activation checkpointing and torch.compile leave it in an EMA state dict
    (Rolling Forcing's and LongLive's)."""
    parts = name.split(".")
    if parts[0] == "blocks":  # blocks.N.<rest>: each block wrapped for FSDP and checkpointing
        return ".".join(["_orig_mod", "blocks", parts[1], "_fsdp_wrapped_module", "_checkpoint_wrapped_module",
                         *parts[2:]])
    return "_fsdp_wrapped_module." + name


def test_ema_keys_with_wrapper_segments_load_equal_to_clean_ones(tmp_path, cfg, models):
    ema = {"model." + wrapped(k): v for k, v in models[0].state_dict().items()}
    assert any("_fsdp_wrapped_module" in k for k in ema) and any("_orig_mod" in k for k in ema)
    path = tmp_path / "rolling_forcing_dmd.pt"
    torch.save({"generator": {"model." + k: v for k, v in models[1].state_dict().items()}, "generator_ema": ema}, path)
    assert same(load_model(path, cfg, key="generator_ema"), models[0])
    assert same(load_model(path, cfg, key="generator"), models[1])


def test_each_recipe_reads_the_state_dict_its_authors_serve(tmp_path, cfg, models):
    path = tmp_path / "ckpt.pt"
    torch.save({"generator": {"model." + k: v for k, v in models[1].state_dict().items()},
                "generator_ema": {"model." + k: v for k, v in models[0].state_dict().items()}}, path)
    want = {"self-forcing": models[0], "rolling-forcing": models[0], "causvid": models[1], "longlive": models[1]}
    for name, model in want.items():
        assert same(load_model(path, cfg, key=recipes.get(name).checkpoint_key), model), name
    only_ema = tmp_path / "ema_only.pt"
    torch.save({"generator_ema": {"model." + k: v for k, v in models[0].state_dict().items()}}, only_ema)
    with pytest.raises(WeightsError, match=r"no 'generator' state dict \(the recipe's\); it holds 'generator_ema'"):
        load_model(only_ema, cfg, key="generator")


def test_checkpoints_are_read_memory_mapped(tmp_path, cfg, models, monkeypatch):
    path = save_checkpoint(models[0], tmp_path / "ckpt.pt")
    seen: list[dict] = []
    load = torch.load

    def spy(*args, **kw):
        seen.append(kw)
        return load(*args, **kw)

    monkeypatch.setattr(weights.torch, "load", spy)
    read_state_dict(path, "generator")
    assert seen and seen[0].get("mmap") is True and seen[0].get("weights_only") is True


# ---------------------------------------------------------------------------- LoRA


def longlive_lora_targets(model: CausalWanModel) -> list[str]:
    """LongLive's adapter targets (utils/lora_utils.py, v1.0): every nn.Linear inside a
    transformer block."""
    return [n for n, m in model.named_modules() if n.startswith("blocks.") and isinstance(m, torch.nn.Linear)]


def peft_model(base: CausalWanModel, rank: int, alpha: float, seed: int):
    """``base`` wrapped by PEFT as LongLive wraps its generator, with random (non-zero) adapters."""
    lora = peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                                     target_modules=longlive_lora_targets(base)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return lora.eval()


def denoise_once(model: CausalWanModel, seed: int = 0) -> torch.Tensor:
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    cache = WanKVCache.create(cfg, LATENT_HEIGHT, LATENT_WIDTH, slots=1)
    slot = cache.allocate()
    text = model.text_kv(torch.randn(1, cfg.text_len, cfg.text_dim, generator=g))
    x = torch.randn(1, cfg.out_dim, cfg.chunk_frames, LATENT_HEIGHT, LATENT_WIDTH, generator=g)
    ctx = cache.chunk([slot])
    model.commit(x, text, ctx)  # one chunk in the cache, then a step that reads it
    x = torch.randn(1, cfg.out_dim, cfg.chunk_frames, LATENT_HEIGHT, LATENT_WIDTH, generator=g)
    return model.denoise(x, torch.tensor([937.5]), text, cache.chunk([slot]))


@pytest.mark.parametrize("wrapper", [True, False])
def test_a_merged_lora_runs_as_peft_runs_the_adapters(tmp_path, cfg, wrapper):
    base = random_model(cfg, seed=4)
    base_path = save_checkpoint(base, tmp_path / "longlive_base.pt", keys=("generator",))
    rank, alpha = 4, 8.0
    lora = peft_model(random_model(cfg, seed=4), rank, alpha, seed=5)
    state = peft.get_peft_model_state_dict(lora)
    assert all(k.startswith("base_model.model.blocks.") for k in state)
    lora_path = tmp_path / "lora.pt"
    torch.save({"generator_lora": state} if wrapper else state, lora_path)
    merged = load_model(base_path, cfg, key="generator", lora=lora_path, lora_alpha=alpha)
    with torch.no_grad():
        want = denoise_once(lora.base_model.model)
        got = denoise_once(merged)
        unadapted = denoise_once(base)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert (unadapted - want).abs().max() > 1e-2  # the adapters matter: the base alone is another model


def test_a_lora_that_does_not_fit_is_named(tmp_path, cfg):
    base_path = save_checkpoint(random_model(cfg, seed=4), tmp_path / "base.pt", keys=("generator",))
    bad = tmp_path / "lora.pt"
    torch.save({"base_model.model.blocks.0.nowhere.lora_A.weight": torch.zeros(2, 48),
                "base_model.model.blocks.0.nowhere.lora_B.weight": torch.zeros(48, 2)}, bad)
    with pytest.raises(WeightsError, match=r"LoRA target 'blocks\.0\.nowhere' is not a weight of the checkpoint"):
        load_model(base_path, cfg, key="generator", lora=bad, lora_alpha=2)


def test_longlive_without_its_lora_is_refused_naming_the_file_and_where_it_is_published(wan_dir, tmp_path):
    d = Path(shutil.copytree(wan_dir, tmp_path / "w"))
    with pytest.raises(FileNotFoundError, match=r"lora\.pt \(LongLive's LoRA.*Efficient-Large-Model/LongLive-1\.3B"):
        check_layout(d, recipes.get("longlive"))
    torch.save({}, d / "transformer" / "lora.pt")
    files, _, _ = check_layout(d, recipes.get("longlive"))
    assert files.lora == d / "transformer" / "lora.pt" and files.checkpoint.name == "model.pt"


# ---------------------------------------------------------------------------- published key sets


def test_the_published_transformer_key_set_is_what_the_loader_expects():
    """Wan2.1-T2V-1.3B's causal transformer at full size, built on the meta device from the
    reference (streamdiffusionv2's causal_model.py): the same names and shapes."""
    reference = pytest.importorskip("models.wan.causal_model", reason="streamdiffusionv2 not installed")
    cfg = WanConfig.wan_1_3b(**recipes.get("self-forcing").config_fields())
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = reference.CausalWanModel(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=1536,
                                       ffn_dim=8960, freq_dim=256, text_dim=4096, out_dim=16, num_heads=12,
                                       num_layers=30, qk_norm=True, cross_attn_norm=True, eps=1e-6)
        ours = CausalWanModel(cfg)
    theirs = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert theirs == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert sum(int(np.prod(s)) for s in theirs.values()) == pytest.approx(1.42e9, rel=0.01)
    # the EMA as FSDP saves it reads to the same names
    cleaned = weights.clean_keys({"model." + wrapped(k): torch.empty(0) for k in theirs})
    assert set(cleaned) == set(theirs)


def test_a_lora_file_names_what_is_wrong_with_it(tmp_path):
    bad = tmp_path / "lora.pt"
    torch.save({"base_model.model.blocks.0.self_attn.q.weight": torch.zeros(2)}, bad)
    with pytest.raises(WeightsError, match="is not a lora_A / lora_B weight"):
        weights.read_lora(bad)
    with pytest.raises(WeightsError, match=r"missing\.pt does not exist"):
        weights.read_lora(tmp_path / "missing.pt")
