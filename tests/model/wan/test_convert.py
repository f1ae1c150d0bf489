"""The authors' own files as they lie: the UMT5 encoder of every Wan download read into
transformers' UMT5EncoderModel (equal to the authors' T5 module), ``worldserve convert``, and
the downloads found by their published names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.model.wan.tiny import build_tiny_checkpoint, tiny_config
from tests.model.wan.tiny_text import build_tiny_tokenizer
from worldserve.cli.main import main as cli_main
from worldserve.model.wan import recipes
from worldserve.model.wan.convert import convert_umt5, load_umt5, umt5_config
from worldserve.model.wan.layout import (
    CLIP_PTH_FILE,
    UMT5_PTH_FILE,
    check_image_layout,
    check_layout,
)
from worldserve.model.wan.text import PromptEncoder
from worldserve.model.wan.weights import load_model

t5 = pytest.importorskip("models.wan.wan_base.modules.t5", reason="streamdiffusionv2 (test dependency) not installed")

VOCAB = 64


def authors_t5(seed: int = 0) -> torch.nn.Module:
    """Wan's T5 encoder as umt5_xxl builds it (per-layer position bias, 32 buckets), tiny."""
    torch.manual_seed(seed)
    enc = t5.T5Encoder(vocab=VOCAB, dim=24, dim_attn=24, dim_ffn=40, num_heads=2, num_layers=2, num_buckets=32,
                       shared_pos=False, dropout=0.0)
    with torch.no_grad():  # weights of a trained model's scale: the init's are tiny
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return enc.eval()


@pytest.fixture(scope="module")
def t5_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    enc = authors_t5()
    path = tmp_path_factory.mktemp("wan") / UMT5_PTH_FILE
    torch.save(enc.state_dict(), path)
    return enc, path


def test_the_authors_umt5_file_reads_into_transformers_and_encodes_the_same(t5_file):
    ref, path = t5_file
    model = load_umt5(path)
    assert umt5_config(torch.load(path, weights_only=True))["num_layers"] == 2
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (2, 40), generator=g)  # longer than the small-position buckets
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 25:] = 0  # a padded prompt
    with torch.no_grad():
        want = ref(ids, mask)
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, :25], want[1, :25], atol=1e-5, rtol=1e-5)  # the prompt's own tokens


def test_convert_writes_a_transformers_folder_that_the_prompt_encoder_loads_as_the_file_does(t5_file, tmp_path):
    _, path = t5_file
    tok = tmp_path / "google" / "umt5-xxl"
    build_tiny_tokenizer(tok)
    out = tmp_path / "text_encoder"
    cli_main(["convert", str(path), str(out)])
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    from_file = PromptEncoder.load(path, tok, text_len=16)
    from_folder = PromptEncoder.load(out, tok, text_len=16)
    prompt = "a red fox runs through snowy woods"
    torch.testing.assert_close(from_file.encode(prompt), from_folder.encode(prompt), atol=0, rtol=0)
    assert convert_umt5(path, tmp_path / "again").is_dir()


def test_convert_takes_the_recipe_s_state_dict_and_merges_longlive_s_lora(tmp_path):
    cfg = tiny_config()
    _, pt, model = build_tiny_checkpoint(tmp_path / "ck", cfg)
    dst = tmp_path / "model.safetensors"
    cli_main(["convert", str(pt), str(dst), "--recipe", "causvid"])
    loaded = load_model(dst, cfg)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())
    with pytest.raises(SystemExit, match=r"recipe longlive merges its LoRA \(lora\.pt"):
        cli_main(["convert", str(pt), str(dst), "--recipe", "longlive"])


def authors_download(root: Path, recipe: recipes.Recipe) -> Path:
    """The files of a recipe where its authors' README downloads them (empty stand-ins: only
    the discovery is checked here; the formats are checked in the tests above)."""
    bb = recipe.backbone
    assert bb is not None
    wan = root / bb.path
    (wan / "google" / "umt5-xxl").mkdir(parents=True)
    for name in ("Wan2.1_VAE.pth", UMT5_PTH_FILE):
        (wan / name).write_bytes(b"")
    for name in ("tokenizer_config.json", "spiece.model"):
        (wan / "google" / "umt5-xxl" / name).write_text("{}")
    (wan / "config.json").write_text(json.dumps({"dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30,
                                                 "model_type": "t2v"}))
    for f in (recipe.checkpoint, recipe.lora):
        if f is not None:
            (root / f.path).parent.mkdir(parents=True, exist_ok=True)
            (root / f.path).write_bytes(b"")
    return root


@pytest.mark.parametrize("name", ["self-forcing", "causvid", "longlive"])
def test_the_authors_downloads_are_found_by_their_published_names(tmp_path, name):
    r = recipes.get(name)
    root = authors_download(tmp_path / name, r)
    files, cfg, served = check_layout(root, r)
    assert files.checkpoint == root / r.checkpoint.path
    assert files.text_encoder is not None and files.text_encoder.name == UMT5_PTH_FILE
    assert files.vae.name == "Wan2.1_VAE.pth" and files.tokenizer == root / "wan_models/Wan2.1-T2V-1.3B/google/umt5-xxl"
    assert (files.lora is not None) == (r.lora is not None)
    assert (cfg.dim, cfg.num_layers, cfg.window_frames) == (1536, 30, r.window_frames)
    assert served.recipe is r and served.overridden == ()


@pytest.mark.parametrize("missing, repo", [
    ("checkpoints/self_forcing_dmd.pt", "gdhe17/Self-Forcing"),
    ("wan_models/Wan2.1-T2V-1.3B/models_t5_umt5-xxl-enc-bf16.pth", "Wan-AI/Wan2.1-T2V-1.3B"),
    ("wan_models/Wan2.1-T2V-1.3B/Wan2.1_VAE.pth", "Wan-AI/Wan2.1-T2V-1.3B"),
])
def test_a_missing_published_file_is_named_with_where_its_authors_publish_it(tmp_path, missing, repo):
    r = recipes.get("self-forcing")
    root = authors_download(tmp_path / "sf", r)
    (root / missing).unlink()
    name = missing.rsplit("/", 1)[-1]
    with pytest.raises(FileNotFoundError, match=rf"{name.replace('.', '[.]')} .*not found for recipe self-forcing "
                                               rf".*its authors publish it in {repo} on Hugging Face"):
        check_layout(root, r)


def test_matrix_game_s_download_is_found_with_the_variant_s_file_and_config(tmp_path):
    r = recipes.get("matrix-game-2-templerun")
    root = tmp_path / "Matrix-Game-2.0"
    (root / "templerun_distilled_model").mkdir(parents=True)
    (root / r.checkpoint.path).write_bytes(b"")
    (root / "Wan2.1_VAE.pth").write_bytes(b"")
    (root / "image_encoder").mkdir()
    (root / "image_encoder" / "config.json").write_text(json.dumps({"hidden_size": 1280}))  # CLIP ViT-H/14's
    (root / "image_encoder" / "model.safetensors").write_bytes(b"")
    files, cfg, served = check_image_layout(root, r)
    assert files.checkpoint == root / r.checkpoint.path and files.config is None
    assert cfg.timesteps == (1000.0, 750.0, 500.0, 250.0) and cfg.action_config is not None
    assert cfg.action_config.keyboard_dim_in == 7 and served.recipe is r
    (root / r.checkpoint.path).unlink()
    with pytest.raises(FileNotFoundError, match=r"templerun_7dim_onlykey\.safetensors .*Skywork/Matrix-Game-2\.0"):
        check_image_layout(root, r)


def test_matrix_game_s_download_serves_its_own_clip_file_and_names_it_when_missing(tmp_path):
    r = recipes.get("matrix-game-2")
    root = tmp_path / "Matrix-Game-2.0"
    (root / "base_distilled_model").mkdir(parents=True)
    for name in (r.checkpoint.path, "Wan2.1_VAE.pth", CLIP_PTH_FILE):
        (root / name).write_bytes(b"")
    files, _, _ = check_image_layout(root, r)
    assert files.image_encoder == root / CLIP_PTH_FILE
    (root / CLIP_PTH_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=rf"{CLIP_PTH_FILE.replace('.', '[.]')} .*not found for recipe "
                                               rf"matrix-game-2-universal .*Skywork/Matrix-Game-2\.0 on Hugging Face"):
        check_image_layout(root, r)
