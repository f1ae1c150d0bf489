"""The published checkpoints of the Wan causal family by name, each with its authors'
inference settings and files.

A recipe is what the authors' own inference scripts do with their checkpoint: the denoising
steps and whether they are warped onto the shifted schedule, the shift, the chunk, the
attention sinks and window, the commit pass's noise, which state dict of the checkpoint they
load (``generator_ema`` or ``generator``), the LoRA they merge, how a prompt change re-caches,
and which sampler runs. ``worldserve serve --recipe NAME`` (or ``--model NAME``) serves one;
a ``config.json`` beside the checkpoint may still set any of these fields (under the house's
names or the authors' training-config names), and wins.

Attention in the house's terms (``model/wan/cache.py``): a chunk sees ``sink_frames`` first
frames, the latest ``window_frames`` committed frames, and itself. The authors' ``local_attn_size``
counts all three; their global attention (``local_attn_size`` -1) attends to every frame of a
cache sized for 21 latent frames (Self-Forcing's 32,760 tokens at 1,560 a frame), which is a
window of 18 behind a chunk of 3 with no sinks: equal to theirs for the 21 frames (81 pixel
frames) they generate. Past those, Self-Forcing's window rolls; CausVid's recipes do as the
authors' long videos do (``long_mode`` "restart": a new rollout from a re-encoded overlap,
model/wan/restart.py), or roll too with ``"long_mode": "rolling"`` in a config.json.

Steps: a few-step student is trained for its own step lists only. A recipe names them
(``timesteps``, and ``fewer_steps`` for any other list; none of the published checkpoints has
one), the runner serves those and no subset of them, and the degradation ladder's step rungs
visit only their counts: a recipe with one list keeps its steps under load. ``fps`` is the rate
the authors' videos are written at, a session's default when its client names none.

Time positions (``positions``, model/wan/cache.py) are the authors' module's: LongLive's
``causal_model.py`` keeps them absolute, its ``causal_model_infinity.py`` (``longlive-infinity``)
ranks the held frames; without sinks the two schemes give the same attention.

This module imports no torch: the server reads it to check files and print the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# WanConfig fields a recipe sets (model/wan/config.py), each also settable by config.json
RECIPE_FIELDS = ("timesteps", "fewer_steps", "warp_timesteps", "shift", "chunk_frames", "sink_frames",
                 "window_frames", "commit_timestep", "positions", "long_mode", "sampler", "fps")

# the authors' training-config names of the same fields (config.py's _ALIASES say the same)
AUTHORS_NAMES = {
    "denoising_step_list": "timesteps", "warp_denoising_step": "warp_timesteps", "timestep_shift": "shift",
    "num_frame_per_block": "chunk_frames", "sink_size": "sink_frames", "local_attn_size": "window_frames",
    "context_noise": "commit_timestep",
}

WAN_T2V_1_3B = "Wan-AI/Wan2.1-T2V-1.3B"


@dataclass(frozen=True, slots=True)
class Published:
    """A file or folder as its authors publish it: its path in their download (as their README
    lays it out) and the command that downloads it."""

    path: str  # relative path in the download, e.g. "checkpoints/self_forcing_dmd.pt"
    repo: str  # the Hugging Face repository that publishes it
    command: str  # the authors' download command

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def where(self) -> str:
        return f"{self.repo} on Hugging Face ({self.command})"


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    family: str  # the runner that serves it: "wan-causal" or "matrix-game-2"
    source: str  # the authors' file these settings are copied from
    timesteps: tuple[float, ...]  # denoising steps, before warping (their denoising_step_list)
    warp_timesteps: bool  # map the steps onto the shifted schedule (warp_denoising_step)
    shift: float  # timestep_shift
    chunk_frames: int  # num_frame_per_block
    sink_frames: int  # sink_size
    window_frames: int  # committed frames a chunk sees besides the sinks (local_attn_size - sinks - chunk)
    checkpoint: Published  # the transformer's weights
    checkpoint_key: str | None  # the state dict their loader takes: "generator_ema", "generator"; None: a bare one
    commit_timestep: float = 0.0  # context_noise
    positions: str = "rank"  # RoPE time positions (model/wan/cache.py): "rank" or "absolute"
    long_mode: str = "rolling"  # past the cache: "rolling" window or "restart" from an overlap (model/wan/restart.py)
    lora: Published | None = None  # a LoRA their loader merges into the checkpoint
    lora_rank: int = 0
    lora_alpha: float = 0.0
    prompt_switch: str = "recache"  # "recache": sinks and window re-committed chunk by chunk; "longlive": see runner
    sampler: str = "chunk"  # "chunk": one chunk at a time; "rolling": Rolling Forcing's window (model/wan/rolling.py)
    # other step lists the checkpoint was trained for (none for any published one: each names one
    # list, so the ladder never changes its steps; a config.json may name more)
    fewer_steps: tuple[tuple[float, ...], ...] = ()
    fps: float = 16.0  # the frame rate of the authors' saved videos: its sessions' default
    variant: str | None = None  # Matrix-Game's action space
    backbone: Published | None = None  # the Wan folder the text encoder, tokenizer and VAE come from
    refused: str | None = None  # why worldserve does not serve it, where it does not

    def config_fields(self) -> dict[str, Any]:
        """The WanConfig fields this recipe sets."""
        return {k: getattr(self, k) for k in RECIPE_FIELDS}

    def describe(self, cfg: Any = None, overridden: tuple[str, ...] = ()) -> dict[str, Any]:
        """What is served, for the log at start and ``/v1/load``: the recipe, and with the final
        ``cfg`` (a WanConfig) its model timesteps and the fields a config.json changed."""
        out: dict[str, Any] = {"name": self.name, "family": self.family, "source": self.source}
        if self.variant:
            out["variant"] = self.variant
        src = cfg if cfg is not None else self
        out.update(_fields(src))
        if cfg is not None:
            out.update(_schedules(cfg))
        out["weights"] = self.checkpoint_key or "state dict"
        out["lora"] = f"rank {self.lora_rank}, alpha {self.lora_alpha:g}, merged" if self.lora else None
        out["prompt_switch"] = self.prompt_switch
        out["sampler"] = self.sampler
        out["overridden_by_config"] = list(overridden)
        return out


def _mg(variant: str, path: str, steps: tuple[float, ...], window: int, yaml: str) -> Recipe:
    return Recipe(
        name=f"matrix-game-2-{variant}", family="matrix-game-2", variant=variant.replace("-", "_"),
        source=f"SkyworkAI/Matrix-Game, Matrix-Game-2/configs/inference_yaml/{yaml} and "
               f"configs/distilled_model/*/config.json",
        timesteps=steps, warp_timesteps=True, shift=5.0, chunk_frames=3, sink_frames=0, window_frames=window,
        checkpoint=Published(path, "Skywork/Matrix-Game-2.0",
                             "huggingface-cli download Skywork/Matrix-Game-2.0 --local-dir Matrix-Game-2.0"),
        checkpoint_key=None, fps=12.0,  # utils/visualize.py writes its videos at 12 fps
    )


_SF_DOWNLOAD = "huggingface-cli download gdhe17/Self-Forcing checkpoints/self_forcing_dmd.pt --local-dir ."
_WAN = Published("wan_models/Wan2.1-T2V-1.3B", WAN_T2V_1_3B,
                 "huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B --local-dir wan_models/Wan2.1-T2V-1.3B")
_LONGLIVE = ("huggingface-cli download Efficient-Large-Model/LongLive-1.3B --include 'models/*' "
             "--local-dir longlive_models")



def _causvid(name: str, yaml: str, steps: tuple[float, ...], warp: bool, folder: str) -> Recipe:
    """One of CausVid's two published checkpoints (its ``generator`` state dict, shift 8, global
    attention over 21 frames), past 21 latent frames in the authors' long mode: a new rollout from
    a re-encoded overlap of one chunk (``longvideo_autoregressive_inference.py``; model/wan/restart.py).
    A config.json's ``"long_mode": "rolling"`` rolls an 18-frame window instead."""
    return Recipe(
        name=name, family="wan-causal",
        source=f"tianweiy/CausVid, {yaml}; minimal_inference/autoregressive_inference.py and "
               f"longvideo_autoregressive_inference.py (num_overlap_frames 3)",
        timesteps=steps, warp_timesteps=warp, shift=8.0, chunk_frames=3, sink_frames=0, window_frames=18,
        long_mode="restart",
        checkpoint=Published(f"{folder}/model.pt", "tianweiy/CausVid",
                             f"huggingface-cli download tianweiy/CausVid {folder}/model.pt --local-dir ."),
        checkpoint_key="generator", backbone=_WAN,
    )


def _longlive(name: str, positions: str, source: str) -> Recipe:
    """LongLive's checkpoint and LoRA under one of its two attention modules: ``causal_model.py``
    (absolute positions: the sinks stay at 0-2 while the chunk sits at its frame) or
    ``causal_model_infinity.py`` (each held frame at its place in the cache)."""
    return Recipe(
        name=name, family="wan-causal", source=source,
        timesteps=(1000.0, 750.0, 500.0, 250.0), warp_timesteps=True, shift=5.0, chunk_frames=3, sink_frames=3,
        window_frames=6, positions=positions,
        checkpoint=Published("longlive_models/models/longlive_base.pt", "Efficient-Large-Model/LongLive-1.3B",
                             _LONGLIVE),
        checkpoint_key="generator",
        lora=Published("longlive_models/models/lora.pt", "Efficient-Large-Model/LongLive-1.3B", _LONGLIVE),
        lora_rank=256, lora_alpha=256.0, prompt_switch="longlive", backbone=_WAN,
    )


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe(
        name="self-forcing", family="wan-causal",
        source="guandeh17/Self-Forcing, configs/self_forcing_dmd.yaml; inference.py --use_ema",
        timesteps=(1000.0, 750.0, 500.0, 250.0), warp_timesteps=True, shift=5.0, chunk_frames=3, sink_frames=0,
        window_frames=18, checkpoint=Published("checkpoints/self_forcing_dmd.pt", "gdhe17/Self-Forcing", _SF_DOWNLOAD),
        checkpoint_key="generator_ema", backbone=_WAN,
    ),
    _causvid("causvid", "configs/wan_causal_dmd.yaml", (1000.0, 757.0, 522.0), False, "autoregressive_checkpoint"),
    _causvid("causvid-warp4", "configs/wan_causal_dmd_warp_4step_cfg2.yaml", (1000.0, 750.0, 500.0, 250.0), True,
             "autoregressive_checkpoint_warp_4step_cfg2"),
    _longlive("longlive", "absolute",
              "NVlabs/LongLive v1.0, configs/longlive_inference.yaml and longlive_interactive_inference.yaml "
              "(wan/modules/causal_model.py: keys rotated at their frame when written)"),
    _longlive("longlive-infinity", "rank",
              "NVlabs/LongLive v1.0, configs/longlive_inference_infinity.yaml (use_infinite_attention: "
              "wan/modules/causal_model_infinity.py, positions by place in the cache)"),
    Recipe(
        name="rolling-forcing", family="wan-causal",
        source="TencentARC/RollingForcing, configs/rolling_forcing_dmd.yaml; inference.py --use_ema; "
               "pipeline/rolling_forcing_inference.py and wan/modules/causal_model.py (the anchor block, 24 frames)",
        timesteps=(1000.0, 800.0, 600.0, 400.0, 200.0), warp_timesteps=True, shift=5.0, chunk_frames=3,
        sink_frames=3, window_frames=18,
        checkpoint=Published("checkpoints/rolling_forcing_dmd.pt", "TencentARC/RollingForcing",
                             "huggingface-cli download TencentARC/RollingForcing checkpoints/rolling_forcing_dmd.pt "
                             "--local-dir ."),
        checkpoint_key="generator_ema", sampler="rolling", positions="absolute", backbone=_WAN,
    ),
    _mg("universal", "base_distilled_model/base_distill.safetensors", (1000.0, 666.0, 333.0), 3,
        "inference_universal.yaml"),
    _mg("gta-drive", "gta_distilled_model/gta_keyboard2dim.safetensors", (1000.0, 666.0, 333.0), 1,
        "inference_gta_drive.yaml"),  # local_attn_size 4: one frame before a chunk of 3
    _mg("templerun", "templerun_distilled_model/templerun_7dim_onlykey.safetensors", (1000.0, 750.0, 500.0, 250.0),
        3, "inference_templerun.yaml"),
)}

ALIASES = {"matrix-game-2": "matrix-game-2-universal"}  # a family name that is also a recipe's

# Matrix-Game's action_config.keyboard_dim_in and mouse -> its variant's recipe
MATRIX_GAME_BY_ACTIONS = {(4, True): "matrix-game-2-universal", (2, True): "matrix-game-2-gta-drive",
                          (7, False): "matrix-game-2-templerun"}


def names() -> tuple[str, ...]:
    return (*RECIPES, *ALIASES)


def get(name: str) -> Recipe:
    """The recipe called ``name``; ValueError naming the known ones."""
    try:
        return RECIPES[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(names())}") from None


def named_in(raw: dict[str, Any]) -> set[str]:
    """The recipe fields a config.json sets, under either name."""
    ours = {k for k in raw if k in RECIPE_FIELDS}
    return ours | {AUTHORS_NAMES[k] for k in raw if k in AUTHORS_NAMES}


@dataclass(frozen=True, slots=True)
class Served:
    """The recipe a runner serves and what a config.json changed in it (printed at start and
    in /v1/load)."""

    recipe: Recipe | None
    overridden: tuple[str, ...] = field(default=())

    def describe(self, cfg: Any) -> dict[str, Any]:
        if self.recipe is None:
            out: dict[str, Any] = {"name": None, "source": "config.json and worldserve's defaults"}
            return {**out, **_fields(cfg), **_schedules(cfg)}
        return self.recipe.describe(cfg, self.overridden)


def _fields(src: Any) -> dict[str, Any]:
    """The recipe fields of a Recipe or WanConfig, tuples as lists."""
    def plain(v: Any) -> Any:
        return [plain(x) for x in v] if isinstance(v, tuple) else v
    return {k: plain(getattr(src, k)) for k in RECIPE_FIELDS}


def _schedules(cfg: Any) -> dict[str, Any]:
    """The model timesteps a session runs: of the full list, and of each trained list by step count
    (the only schedules the ladder picks from)."""
    return {"model_timesteps": [round(t, 3) for t in cfg.step_timesteps],
            "schedules": {str(len(ts)): [round(t, 3) for t in ts] for ts in cfg.schedules}}
