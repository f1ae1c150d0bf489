"""Matrix-Game's CLIP file as its authors ship it (``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``:
Wan's XLMRobertaCLIP state dict) read into transformers' CLIPVisionModel, and converted by
``worldserve convert``, equal to open-clip's own ViT tower at the penultimate block (the tokens
Matrix-Game's ``encode_video`` takes, ``use_31_block``).

The reference is open-clip's ``VisionTransformer`` (``open-clip-torch``, a test dependency) at a
tiny width with random weights, saved under the authors' key names. open-clip's package imports
torchvision, and the only torchvision wheel for torch 2.13 is a CUDA build that does not import
on a CPU-only machine; its ViT module needs torchvision only for a batch-norm class it does not
use, so where torchvision does not import, the module is loaded with a stand-in for that one
class (``_open_clip_vit``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from worldserve.cli.main import main as cli_main
from worldserve.model.wan.clip import (
    CLIP_HEADS,
    CLIP_MEAN,
    CLIP_STD,
    ImageEncoder,
    clip_config,
    load_authors_clip,
)
from worldserve.model.wan.layout import CLIP_PTH_FILE

if importlib.util.find_spec("open_clip") is None:
    pytest.skip("open-clip-torch (test dependency) not installed", allow_module_level=True)

WIDTH, LAYERS, PATCH, IMAGE = 32, 3, 14, 42  # a 3 x 3 grid: 10 tokens


def _open_clip_vit() -> type:
    """open-clip's ``VisionTransformer`` class."""
    try:
        import open_clip

        return open_clip.transformer.VisionTransformer
    except (ImportError, RuntimeError):  # torchvision missing, or a build that does not import here
        pass
    before = set(sys.modules)
    spec = importlib.util.find_spec("open_clip")
    assert spec is not None and spec.submodule_search_locations is not None
    pkg = types.ModuleType("open_clip")
    pkg.__path__ = list(spec.submodule_search_locations)  # the package without its __init__'s imports
    misc = types.ModuleType("torchvision.ops.misc")
    misc.FrozenBatchNorm2d = torch.nn.BatchNorm2d  # type: ignore[attr-defined]  # imported, unused by the ViT
    stand_ins = {"open_clip": pkg, "torchvision": types.ModuleType("torchvision"),
                 "torchvision.ops": types.ModuleType("torchvision.ops"), "torchvision.ops.misc": misc}
    saved = {k: sys.modules[k] for k in stand_ins if k in sys.modules}
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("open_clip.transformer").VisionTransformer
    finally:
        for k in set(sys.modules) - before:
            del sys.modules[k]
        sys.modules.update(saved)


def open_clip_tower(seed: int = 0) -> torch.nn.Module:
    """open-clip's ViT tower as ViT-H-14 is built (exact GELU, pre-norm, class token, no patch
    bias), tiny, with the authors' 16 heads, random weights of a trained model's scale."""
    torch.manual_seed(seed)
    vit = _open_clip_vit()(image_size=IMAGE, patch_size=PATCH, width=WIDTH, layers=LAYERS, heads=CLIP_HEADS,
                           mlp_ratio=4.0, output_dim=24)
    with torch.no_grad():
        for p in vit.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return vit.eval()


def authors_state(vit: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tower's weights under the authors' names (Wan's XLMRobertaCLIP: ``visual.*``), with
    text-tower and logit-scale entries as the file has them."""
    sd = vit.state_dict()
    out = {
        "visual.patch_embedding.weight": sd["conv1.weight"],
        "visual.cls_embedding": sd["class_embedding"].reshape(1, 1, -1),
        "visual.pos_embedding": sd["positional_embedding"][None],
        "visual.head": sd["proj"],
        "log_scale": torch.tensor(4.6),
        "textual.token_embedding.weight": torch.randn(10, 8),
        "textual.head.0.weight": torch.randn(8, 8),
    }
    for ours, theirs in (("pre_norm", "ln_pre"), ("post_norm", "ln_post")):
        for kind in ("weight", "bias"):
            out[f"visual.{ours}.{kind}"] = sd[f"{theirs}.{kind}"]
    names = {"ln_1": "norm1", "ln_2": "norm2", "attn.in_proj": "attn.to_qkv", "attn.out_proj": "attn.proj",
             "mlp.c_fc": "mlp.0", "mlp.c_proj": "mlp.2"}
    for i in range(LAYERS):
        for theirs, ours in names.items():
            for kind in ("weight", "bias"):
                key = f"transformer.resblocks.{i}.{theirs}{'_' if theirs == 'attn.in_proj' else '.'}{kind}"
                out[f"visual.transformer.{i}.{ours}.{kind}"] = sd[key]
    return {k: v.clone() for k, v in out.items()}


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    vit = open_clip_tower()
    path = tmp_path_factory.mktemp("mg") / CLIP_PTH_FILE
    torch.save(authors_state(vit), path)
    return vit, path


def penultimate(vit: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """open-clip's tokens after the penultimate block, class token first: (B, 1 + N, width)."""
    out = vit.forward_intermediates(x, indices=[LAYERS - 2], output_fmt="NLC", output_extra_tokens=True,
                                    intermediates_only=True)
    return torch.cat([out["image_intermediates_prefix"][0], out["image_intermediates"][0]], dim=1)


def matrix_game_input(frame: np.ndarray) -> torch.Tensor:
    """Matrix-Game's preprocessing (``encode_video``): the frame in [-1, 1], resized bicubic to the
    model's size, mapped to [0, 1] and normalised with CLIP's mean and std."""
    x = torch.from_numpy(frame).permute(2, 0, 1)[None].float() / 127.5 - 1.0
    x = F.interpolate(x, size=(IMAGE, IMAGE), mode="bicubic", align_corners=False) * 0.5 + 0.5
    return (x - torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(CLIP_STD).view(1, 3, 1, 1)


def test_the_authors_clip_file_reads_into_transformers_and_encodes_as_open_clip(clip_file):
    vit, path = clip_file
    cfg = clip_config(torch.load(path, weights_only=True))
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["image_size"], cfg["patch_size"]) == (
        WIDTH, LAYERS, IMAGE, PATCH)
    x = torch.randn(2, 3, IMAGE, IMAGE)
    with torch.no_grad():
        got = load_authors_clip(path)(pixel_values=x, output_hidden_states=True).hidden_states[-2]
        want = penultimate(vit, x)
    assert got.shape == (2, 10, WIDTH)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_image_encoder_reads_the_file_and_its_converted_folder_to_matrix_game_s_tokens(clip_file, tmp_path):
    vit, path = clip_file
    frame = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    with torch.no_grad():
        want = penultimate(vit, matrix_game_input(frame))
    from_file = ImageEncoder.load(path).encode(frame)
    torch.testing.assert_close(from_file, want, atol=1e-5, rtol=1e-5)
    out = tmp_path / "image_encoder"
    cli_main(["convert", str(path), str(out)])
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    torch.testing.assert_close(ImageEncoder.load(out).encode(frame), from_file, atol=0, rtol=0)


def test_an_unknown_key_in_the_clip_file_is_named(tmp_path):
    state = authors_state(open_clip_tower())
    state["visual.transformer.0.attn.rel_pos.weight"] = torch.zeros(2)
    torch.save(state, tmp_path / CLIP_PTH_FILE)
    with pytest.raises(ValueError, match=r"visual\.transformer\.0\.attn\.rel_pos\.weight"):
        load_authors_clip(tmp_path / CLIP_PTH_FILE)
