"""Each recipe against its authors' published inference config, copied here as data with its
source; and a recipe's settings through the loading path: a config.json overrides them, the
served recipe is what /v1/load shows."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from tests.model.wan.test_causal import WAN_1_3B_CONFIG
from tests.model.wan.tiny_dir import load_tiny
from worldserve.model.registry import check
from worldserve.model.wan import recipes
from worldserve.model.wan.config import WanConfig
from worldserve.model.wan.layout import build_config, check_layout
from worldserve.server import http_api
from worldserve.server.keys import SERVICE

FRAME_SEQ_LENGTH = 1560  # tokens a latent frame at 480x832, the authors' frame_seq_length

# guandeh17/Self-Forcing @33593df: configs/self_forcing_dmd.yaml, configs/default_config.yaml
# (context_noise), README's `inference.py ... --use_ema`, pipeline/causal_inference.py
# (local_attn_size -1: kv_cache_size = 32760 tokens)
SELF_FORCING = {"denoising_step_list": [1000, 750, 500, 250], "warp_denoising_step": True, "timestep_shift": 5.0,
                "num_frame_per_block": 3, "context_noise": 0}
SELF_FORCING_KV_CACHE_TOKENS = 32760
# tianweiy/CausVid @ca21150: configs/wan_causal_dmd.yaml; minimal_inference/autoregressive_inference.py
# loads ['generator']; its causal model attends globally over the same 21-frame cache
CAUSVID = {"denoising_step_list": [1000, 757, 522, 0], "timestep_shift": 8.0, "num_frame_per_block": 3,
           "warp_denoising_step": False}
# NVlabs/LongLive branch v1.0: configs/longlive_inference.yaml (and longlive_interactive_inference.yaml)
LONGLIVE = {"denoising_step_list": [1000, 750, 500, 250], "warp_denoising_step": True, "num_frame_per_block": 3,
            "local_attn_size": 12, "timestep_shift": 5.0, "sink_size": 3, "use_ema": False, "context_noise": 0,
            "generator_ckpt": "longlive_models/models/longlive_base.pt",
            "lora_ckpt": "longlive_models/models/lora.pt", "adapter": {"type": "lora", "rank": 256, "alpha": 256}}
# the same branch: configs/longlive_inference_infinity.yaml, whose model_kwargs add use_infinite_attention
# (wan/modules/causal_model_infinity.py instead of causal_model.py)
LONGLIVE_INFINITY = {**LONGLIVE, "use_infinite_attention": True}
# TencentARC/RollingForcing @a1477d0: configs/rolling_forcing_dmd.yaml; README's `--use_ema`
ROLLING_FORCING = {"denoising_step_list": [1000, 800, 600, 400, 200], "warp_denoising_step": True,
                   "timestep_shift": 5.0, "num_frame_per_block": 3}
# SkyworkAI/Matrix-Game, Matrix-Game-2/configs/inference_yaml/inference_{universal,gta_drive,templerun}.yaml
# and configs/distilled_model/*/config.json (local_attn_size, sink_size), as in zoheth/Matrix-Game @8ed02bd
MATRIX_GAME = {
    "universal": {"denoising_step_list": [1000, 666, 333], "warp_denoising_step": True, "num_frame_per_block": 3,
                  "context_noise": 0, "timestep_shift": 5.0, "local_attn_size": 6, "sink_size": 0},
    "gta_drive": {"denoising_step_list": [1000, 666, 333], "warp_denoising_step": True, "num_frame_per_block": 3,
                  "context_noise": 0, "timestep_shift": 5.0, "local_attn_size": 4, "sink_size": 0},
    "templerun": {"denoising_step_list": [1000, 750, 500, 250], "warp_denoising_step": True,
                  "num_frame_per_block": 3, "context_noise": 0, "timestep_shift": 5.0, "local_attn_size": 6,
                  "sink_size": 0},
}


def published(raw: dict[str, Any]) -> WanConfig:
    """The config the authors' files describe, read by worldserve's own reader. Their time
    positions are absolute (``causal_model.py``) unless ``use_infinite_attention`` picks
    ``causal_model_infinity.py``, which places each held frame at its rank in the cache."""
    keys = ("denoising_step_list", "warp_denoising_step", "timestep_shift", "num_frame_per_block", "context_noise",
            "local_attn_size", "sink_size")
    return WanConfig.from_dict({**WAN_1_3B_CONFIG, **{k: v for k, v in raw.items() if k in keys}},
                               sink_frames=raw.get("sink_size", 0),
                               positions="rank" if raw.get("use_infinite_attention") else "absolute")


def served(name: str) -> WanConfig:
    return build_config(None, recipes.get(name), WanConfig.wan_1_3b())[0]


@pytest.mark.parametrize("name, raw", [("self-forcing", SELF_FORCING), ("causvid", CAUSVID)])
def test_self_forcing_and_causvid_attend_globally_over_their_21_frame_cache_with_no_sinks(name, raw):
    cfg = served(name)
    want = published(raw)
    for k in ("timesteps", "warp_timesteps", "shift", "chunk_frames", "commit_timestep", "sink_frames"):
        assert getattr(cfg, k) == getattr(want, k), k
    assert cfg.sink_frames == 0
    # the chunk and everything before it, up to the cache the authors allocate
    assert cfg.window_frames + cfg.chunk_frames == SELF_FORCING_KV_CACHE_TOKENS // FRAME_SEQ_LENGTH == 21


def test_self_forcing_serves_its_ema_and_causvid_its_generator_unwarped():
    sf, cv = recipes.get("self-forcing"), recipes.get("causvid")
    assert sf.checkpoint_key == "generator_ema" and cv.checkpoint_key == "generator"
    assert served("self-forcing").step_timesteps == pytest.approx((1000.0, 937.5, 833.333333, 625.0))
    assert served("causvid").step_timesteps == (1000.0, 757.0, 522.0)


@pytest.mark.parametrize("name, raw", [("longlive", LONGLIVE), ("longlive-infinity", LONGLIVE_INFINITY)])
def test_longlive_is_its_inference_config_with_its_lora_and_generator(name, raw):
    r = recipes.get(name)
    cfg, want = served(name), published(raw)
    assert cfg == want
    assert cfg.sink_frames + cfg.window_frames + cfg.chunk_frames == LONGLIVE["local_attn_size"]
    assert r.checkpoint_key == ("generator_ema" if LONGLIVE["use_ema"] else "generator")
    assert (r.lora_rank, r.lora_alpha) == (LONGLIVE["adapter"]["rank"], LONGLIVE["adapter"]["alpha"])
    assert r.checkpoint.path == LONGLIVE["generator_ckpt"] and r.lora is not None
    assert r.lora.path == LONGLIVE["lora_ckpt"]
    assert r.prompt_switch == "longlive"


def test_rolling_forcing_has_its_five_steps_its_anchor_and_its_rolling_sampler():
    r, cfg = recipes.get("rolling-forcing"), served("rolling-forcing")
    assert cfg.timesteps == published(ROLLING_FORCING).timesteps and r.refused is None
    assert r.checkpoint_key == "generator_ema" and cfg.sampler == "rolling" and cfg.positions == "absolute"
    assert cfg.sink_frames == cfg.chunk_frames == 3  # the anchor block
    assert cfg.window_frames + cfg.chunk_frames == 21  # max_attention_size of the clean pass, in frames
    assert cfg.step_timesteps == pytest.approx((1000.0, 952.380952, 882.352941, 769.230769, 555.555556))


@pytest.mark.parametrize("variant", ["universal", "gta_drive", "templerun"])
def test_each_matrix_game_variant_has_its_own_steps_and_window(variant):
    raw = MATRIX_GAME[variant]
    r = recipes.get("matrix-game-2-" + variant.replace("_", "-"))
    assert r.variant == variant
    assert r.timesteps == tuple(float(t) for t in raw["denoising_step_list"])
    assert (r.warp_timesteps, r.shift, r.chunk_frames, r.sink_frames, r.commit_timestep) == (
        raw["warp_denoising_step"], raw["timestep_shift"], raw["num_frame_per_block"], raw["sink_size"],
        raw["context_noise"])
    assert r.window_frames == raw["local_attn_size"] - raw["sink_size"] - raw["num_frame_per_block"]
    assert r.refused is None and WanConfig.matrix_game_2(variant).timesteps == r.timesteps
    assert len(WanConfig.matrix_game_2("templerun").step_timesteps) == 4


@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_each_published_recipe_is_trained_for_one_step_list_and_names_its_videos_frame_rate(name):
    r = recipes.get(name)
    cfg = WanConfig(**r.config_fields())
    assert cfg.step_lists == (r.timesteps,)  # no other list: the ladder never changes its steps
    assert r.fps == (12.0 if r.family == "matrix-game-2" else 16.0)  # utils/visualize.py; inference.py fps=16
    assert cfg.fps == r.fps and r.describe(cfg)["schedules"] == {
        str(len(r.timesteps)): [round(t, 3) for t in cfg.step_timesteps]}


def test_a_recipe_names_every_family_once_and_an_unknown_one_lists_them():
    assert set(recipes.names()) >= {"self-forcing", "causvid", "longlive", "rolling-forcing", "matrix-game-2",
                                    "matrix-game-2-universal", "matrix-game-2-gta-drive", "matrix-game-2-templerun"}
    with pytest.raises(ValueError, match="unknown recipe 'sf'; known recipes: self-forcing, causvid"):
        recipes.get("sf")


def test_a_config_json_overrides_the_recipe_field_by_field_and_says_which(wan_dir, tmp_path):
    d = tmp_path / "w"
    shutil.copytree(wan_dir, d)
    path = d / "transformer" / "config.json"
    raw = json.loads(path.read_text())
    arch = {k: v for k, v in raw.items() if k not in WanConfig.__dataclass_fields__ or k in (
        "dim", "ffn_dim", "freq_dim", "text_dim", "in_dim", "out_dim", "num_heads", "num_layers", "text_len",
        "patch_size", "eps", "qk_norm", "cross_attn_norm", "model_type", "image_dim", "rope_theta")}
    path.write_text(json.dumps({**arch, "num_frame_per_block": 2, "denoising_step_list": [1000, 500]}))
    _, cfg, s = check_layout(d, recipes.get("self-forcing"))
    assert (cfg.chunk_frames, cfg.timesteps) == (2, (1000.0, 500.0))  # the file's
    assert (cfg.sink_frames, cfg.window_frames, cfg.warp_timesteps) == (0, 18, True)  # the recipe's
    shown = s.describe(cfg)
    assert shown["name"] == "self-forcing" and shown["overridden_by_config"] == ["chunk_frames", "timesteps"]
    assert shown["weights"] == "generator_ema" and shown["model_timesteps"] == [1000.0, 833.333]


def test_a_wan_recipe_is_not_served_as_matrix_game_and_back(wan_dir):
    with pytest.raises(ValueError, match="served by --model matrix-game-2, not wan-causal"):
        check_layout(wan_dir, recipes.get("matrix-game-2-templerun"))


def test_a_recipe_named_as_the_model_serves_its_family_and_v1_load_shows_it(wan_dir):
    check("self-forcing", wan_dir)
    runner = load_tiny("self-forcing", wan_dir)
    assert runner.served.recipe is recipes.get("self-forcing")
    with pytest.raises(ValueError, match="--recipe causvid names another"):
        check("self-forcing", wan_dir, "causvid")

    class Service:  # what /v1/load reads of the service
        engine = type("Engine", (), {"runner": runner})()

        def load(self) -> dict[str, Any]:
            return {"state": "ready"}

    app = web.Application()
    app[SERVICE] = Service()  # type: ignore[assignment]
    body = json.loads(asyncio.run(http_api.load(make_mocked_request("GET", "/v1/load", app=app))).body)
    assert body["recipe"]["name"] == "self-forcing" and body["recipe"]["weights"] == "generator_ema"
    assert body["recipe"]["chunk_frames"] == runner.cfg.chunk_frames  # the tiny config.json's, as served
