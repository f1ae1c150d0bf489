"""Loading the Wan transformer's weights as the authors publish them, and refusing what does not fit."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from safetensors.torch import save_file

from tests.model.wan.tiny import random_model, save_checkpoint, tiny_config
from worldserve.model.wan.causal import CausalWanModel
from worldserve.model.wan.weights import (
    WeightsError,
    convert,
    load_model,
    load_weights,
    read_state_dict,
)


@pytest.fixture(scope="module")
def cfg():
    return tiny_config()


@pytest.fixture(scope="module")
def models(cfg):
    return random_model(cfg, seed=0), random_model(cfg, seed=1)


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sb = b.state_dict()
    for key, value in a.state_dict().items():
        assert torch.equal(value.float(), sb[key].float()), key


def test_generator_ema_is_preferred_over_generator(tmp_path, cfg, models):
    ema, raw = models
    sd = lambda m: {"model." + k: v for k, v in m.state_dict().items()}  # noqa: E731
    path = tmp_path / "self_forcing.pt"
    torch.save({"generator": sd(raw), "generator_ema": sd(ema), "step": 600}, path)
    assert_same_weights(load_model(path, cfg), ema)


@pytest.mark.parametrize("keys, prefix",
                         [(("generator",), "model."), (("generator_ema",), ""), ((), "model."), ((), "")])
def test_authors_checkpoints_load_with_or_without_the_wrapper_prefix(tmp_path, cfg, models, keys, prefix):
    path = save_checkpoint(models[0], tmp_path / "ckpt.pt", keys=keys, prefix=prefix)
    assert_same_weights(load_model(path, cfg), models[0])


def test_convert_writes_safetensors_that_load_the_same(tmp_path, cfg, models):
    src = save_checkpoint(models[1], tmp_path / "ckpt.pt")
    dst = convert(src, tmp_path / "out" / "transformer.safetensors")
    assert dst.is_file()
    assert_same_weights(load_model(dst, cfg), models[1])
    half = convert(save_checkpoint({k: v.bfloat16() for k, v in models[1].state_dict().items()}, tmp_path / "bf16.pt"),
                   tmp_path / "bf16.safetensors")
    assert all(v.dtype == torch.bfloat16 for v in read_state_dict(half).values())  # dtypes are kept
    assert load_model(half, cfg, dtype=torch.bfloat16).patch_embedding.weight.dtype == torch.bfloat16
    with pytest.raises(WeightsError, match=r"should end in \.safetensors"):
        convert(src, tmp_path / "out.pt")


def test_sharded_safetensors_load_through_their_index(tmp_path, cfg, models):
    sd = models[0].state_dict()
    keys = sorted(sd)
    parts = {"a.safetensors": keys[: len(keys) // 2], "b.safetensors": keys[len(keys) // 2:]}
    for name, part in parts.items():
        save_file({k: sd[k].contiguous() for k in part}, str(tmp_path / name))
    index = tmp_path / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {k: n for n, ks in parts.items() for k in ks}}))
    assert_same_weights(load_model(index, cfg), models[0])
    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(WeightsError, match=r"names .*b\.safetensors, which does not exist"):
        load_model(index, cfg)


def test_a_missing_key_names_the_file_the_key_and_its_shape(tmp_path, cfg, models):
    sd = dict(models[0].state_dict())
    del sd["blocks.1.cross_attn.norm_k.weight"]
    path = save_checkpoint(sd, tmp_path / "missing.pt")
    with pytest.raises(WeightsError, match=r"missing\.pt: key 'blocks\.1\.cross_attn\.norm_k\.weight' "
                                           r"is missing \(expected shape \(48,\)"):
        load_model(path, cfg)
    assert issubclass(WeightsError, ValueError)


def test_an_extra_key_names_the_file_and_the_key(tmp_path, cfg, models):
    sd = {**models[0].state_dict(), "img_emb.proj.0.weight": torch.zeros(3)}
    path = save_checkpoint(sd, tmp_path / "extra.pt")
    with pytest.raises(WeightsError, match=r"extra\.pt: unexpected key 'img_emb\.proj\.0\.weight' \(shape \(3,\)"):
        load_model(path, cfg)


def test_a_wrong_shape_names_the_file_the_key_and_both_shapes(tmp_path, cfg, models):
    wide = random_model(tiny_config(ffn_dim=64), seed=0)
    path = save_checkpoint(wide, tmp_path / "wide.pt")
    with pytest.raises(WeightsError, match=r"wide\.pt: key 'blocks\.0\.ffn\.0\.weight' "
                                           r"has shape \(64, 48\), expected \(96, 48\)"):
        load_model(path, cfg)
    model = CausalWanModel(cfg)
    with pytest.raises(WeightsError, match=r"wide\.pt"):
        load_weights(model, path)


class Payload:
    """An object whose unpickling would run code: it touches a file."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_pickle_with_an_arbitrary_object_is_refused_without_running_it(tmp_path, cfg, models):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"generator": dict(models[0].state_dict()), "hook": Payload(marker)}, path)
    with pytest.raises(WeightsError, match=r"evil\.pt holds objects other than tensors.*refused"):
        load_model(path, cfg)
    assert not marker.exists()


def test_unreadable_files_are_named(tmp_path, cfg):
    with pytest.raises(WeightsError, match=r"nothere\.pt does not exist"):
        load_model(tmp_path / "nothere.pt", cfg)
    (tmp_path / "w.ckpt").write_bytes(b"x")
    with pytest.raises(WeightsError, match=r"w\.ckpt: unknown format"):
        load_model(tmp_path / "w.ckpt", cfg)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError, match=r"junk\.safetensors is not a readable safetensors file"):
        load_model(tmp_path / "junk.safetensors", cfg)
    torch.save({"generator": {"a": 1}}, tmp_path / "odd.pt")
    with pytest.raises(WeightsError, match=r"odd\.pt: .*key 'a' .* is not a tensor"):
        load_model(tmp_path / "odd.pt", cfg)
