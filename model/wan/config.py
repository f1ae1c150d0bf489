"""The Wan2.1 causal family's configuration: the transformer as its authors define it, plus the
serving recipe (chunk size, sinks, window, denoising schedule) that Self-Forcing, CausVid,
LongLive and Rolling Forcing share, and Matrix-Game 2.0's image condition and action modules
(``model_type="i2v"``, ``ActionConfig``).

Field names of the transformer part are the authors' (``config.json`` of Wan2.1-T2V-1.3B); the
recipe fields carry the house's names, and ``from_json`` also reads the keys the authors'
training configs use for them (``denoising_step_list``, ``num_frame_per_block``, ...).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from worldserve.model.wan import recipes


@dataclass(frozen=True)
class ActionConfig:
    """Matrix-Game 2.0's action modules, under the names of the ``action_config`` of its
    authors' ``config.json`` (their ``blocks`` are the transformer blocks that hold one)."""

    blocks: tuple[int, ...] = tuple(range(15))  # transformer blocks with an action module
    enable_keyboard: bool = True  # keyboard cross-attention (every variant)
    enable_mouse: bool = True  # mouse self-attention per token (universal, gta_drive; not templerun)
    heads_num: int = 16  # heads of both attentions
    hidden_size: int = 128  # width of one embedded keyboard action
    img_hidden_size: int = 1536  # the transformer's width (dim)
    keyboard_dim_in: int = 4  # keyboard vector: 4 universal (W S A D), 2 gta_drive, 7 templerun
    keyboard_hidden_dim: int = 1024  # keyboard attention width (heads_num heads)
    mouse_dim_in: int = 2  # mouse vector: (pitch, yaw)
    mouse_hidden_dim: int = 1024  # mouse attention width (heads_num heads)
    mouse_qk_dim_list: tuple[int, int, int] = (8, 28, 28)  # RoPE dims (time, height, width) of a head
    patch_size: tuple[int, int, int] = (1, 2, 2)
    qk_norm: bool = True  # RMS norm of each head's queries and keys
    qkv_bias: bool = False  # biases of the attention projections
    rope_dim_list: tuple[int, int, int] = (8, 28, 28)
    rope_theta: float = 256.0  # RoPE base of the action attentions (time only: one token per frame)
    vae_time_compression_ratio: int = 4  # pixel frames per latent frame
    windows_size: int = 3  # latent frames of actions each latent frame sees: 4 * 3 pixel frames

    def __post_init__(self) -> None:
        for name in ("heads_num", "hidden_size", "img_hidden_size", "keyboard_dim_in", "keyboard_hidden_dim",
                     "vae_time_compression_ratio", "windows_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"ActionConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.enable_keyboard:
            raise ValueError("ActionConfig.enable_keyboard is False: every Matrix-Game variant takes the keyboard")
        widths = (("keyboard_hidden_dim", self.keyboard_hidden_dim), ("mouse_hidden_dim", self.mouse_hidden_dim))
        for name, width in widths:
            if (name == "keyboard_hidden_dim" or self.enable_mouse) and width % self.heads_num:
                raise ValueError(f"ActionConfig.{name} {width!r} is not divisible by heads_num {self.heads_num!r}")
        if self.enable_mouse and min(self.mouse_dim_in, self.mouse_hidden_dim) < 1:
            raise ValueError(f"ActionConfig: mouse enabled with mouse_dim_in {self.mouse_dim_in!r}, "
                             f"mouse_hidden_dim {self.mouse_hidden_dim!r}")
        if self.mouse_qk_dim_list[0] % 2 or self.mouse_qk_dim_list[0] < 2:
            raise ValueError(f"ActionConfig.mouse_qk_dim_list {self.mouse_qk_dim_list!r}: the time part must be even")
        for name, width in (("keyboard", self.keyboard_hidden_dim), ("mouse", self.mouse_hidden_dim)):
            if (name == "keyboard" or self.enable_mouse) and sum(self.mouse_qk_dim_list) != width // self.heads_num:
                raise ValueError(f"ActionConfig.mouse_qk_dim_list {self.mouse_qk_dim_list!r} does not sum to the "
                                 f"{name} head dim {width // self.heads_num}")

    @property
    def window_pixel_frames(self) -> int:
        """Pixel-frame actions each latent frame is conditioned on (12: 3 latent frames of 4)."""
        return self.vae_time_compression_ratio * self.windows_size

    @property
    def time_pairs(self) -> int:
        """Rotary pairs of an action head turned by the frame's position (the rest see position 0)."""
        return self.mouse_qk_dim_list[0] // 2

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ActionConfig:
        known = {f.name for f in fields(cls)}
        out: dict[str, Any] = {k: v for k, v in raw.items() if k in known}
        for k in ("blocks", "mouse_qk_dim_list", "patch_size", "rope_dim_list"):
            if k in out:
                out[k] = tuple(int(v) for v in out[k])
        return cls(**out)


@dataclass(frozen=True)
class WanConfig:
    # --- transformer (Wan's own config.json names) ---
    dim: int = 1536  # transformer width
    ffn_dim: int = 8960  # hidden width of each block's MLP
    freq_dim: int = 256  # size of the sinusoidal timestep embedding fed to time_embedding
    text_dim: int = 4096  # width of the text encoder's output (UMT5-XXL: 4096)
    in_dim: int = 16  # latent channels in (the Wan2.1 VAE's z_dim)
    out_dim: int = 16  # latent channels out
    num_heads: int = 12  # attention heads; head_dim = dim // num_heads, even, split 3 ways by RoPE
    num_layers: int = 30  # transformer blocks
    patch_size: tuple[int, int, int] = (1, 2, 2)  # (frames, height, width) of one token, in latents
    text_len: int = 512  # text tokens the cross-attention sees (prompt zero-padded to this)
    eps: float = 1e-6  # epsilon of every LayerNorm and RMSNorm
    qk_norm: bool = True  # RMSNorm on queries and keys (over the full width) before attention
    cross_attn_norm: bool = True  # affine LayerNorm (norm3) before cross-attention
    model_type: str = "t2v"  # "t2v": text cross-attention; "i2v": Matrix-Game's, over CLIP image tokens only
    image_dim: int = 1280  # width of the CLIP image tokens img_emb takes (i2v; CLIP ViT-H/14: 1280)
    action_config: ActionConfig | None = None  # Matrix-Game's action modules (i2v), None for none
    rope_theta: float = 10000.0  # RoPE base, as Wan's rope_params
    # --- serving recipe ---
    chunk_frames: int = 3  # latent frames generated per chunk (num_frame_per_block)
    sink_frames: int = 3  # first latent frames of an epoch, kept in the cache forever
    window_frames: int = 9  # latest committed latent frames a chunk reads besides the sinks
    timesteps: tuple[float, ...] = (1000.0, 750.0, 500.0, 250.0)  # denoising steps, before warping
    # further step lists the checkpoint was trained for, each shorter than ``timesteps`` (none: the
    # ladder never changes the steps; a fewer-step session runs one of these lists, never a subset)
    fewer_steps: tuple[tuple[float, ...], ...] = ()
    warp_timesteps: bool = True  # map each step onto the shifted schedule (Self-Forcing's warp_denoising_step)
    shift: float = 5.0  # flow-matching schedule shift: sigma' = shift*s / (1 + (shift-1)*s)
    num_train_timesteps: int = 1000  # timestep scale: sigma = timestep / num_train_timesteps
    commit_timestep: float = 0.0  # timestep of the commit pass that writes the cache (context_noise)
    positions: str = "rank"  # RoPE time positions (model/wan/cache.py): "rank" of held frames, or "absolute"
    long_mode: str = "rolling"  # past the cache: "rolling" window, or "restart" (CausVid's; model/wan/restart.py)
    sampler: str = "chunk"  # "chunk": each chunk through every step; "rolling": Rolling Forcing's window
    fps: float = 16.0  # the frame rate the authors' videos play at: a session's default (motion at its pace)

    def __post_init__(self) -> None:
        for name in ("dim", "ffn_dim", "freq_dim", "text_dim", "in_dim", "out_dim", "num_heads",
                     "num_layers", "text_len", "chunk_frames", "num_train_timesteps"):
            if getattr(self, name) < 1:
                raise ValueError(f"WanConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.dim % self.num_heads:
            raise ValueError(f"WanConfig.dim {self.dim!r} is not divisible by num_heads {self.num_heads!r}")
        if self.head_dim % 2:
            raise ValueError(f"WanConfig head_dim {self.head_dim!r} (dim / num_heads) must be even for RoPE")
        if min(self.rope_pairs) < 1:
            raise ValueError(
                f"WanConfig head_dim {self.head_dim!r} is too small to split RoPE over frames, height, width")
        if self.freq_dim % 2:
            raise ValueError(f"WanConfig.freq_dim must be even, got {self.freq_dim!r}")
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"WanConfig.patch_size must be 3 positive ints, got {self.patch_size!r}")
        if self.patch_size[0] != 1:
            raise ValueError(f"WanConfig.patch_size {self.patch_size!r}: the causal cache needs 1 frame per token")
        if self.model_type not in ("t2v", "i2v"):
            raise ValueError(f"WanConfig.model_type {self.model_type!r}: 't2v' or 'i2v' (Matrix-Game) are served")
        if self.model_type == "i2v" and self.in_dim != self.out_dim + self.cond_dim:
            raise ValueError(
                f"WanConfig.in_dim {self.in_dim!r}: an i2v model takes its {self.out_dim} latent channels plus "
                f"{self.cond_dim} of image condition (4 mask + {self.out_dim} latent), {self.out_dim + self.cond_dim}"
            )
        if self.action_config is not None:
            if self.model_type != "i2v":
                raise ValueError(
                    "WanConfig.action_config is set on a t2v model; action modules are Matrix-Game's (i2v)")
            a = self.action_config
            if a.img_hidden_size != self.dim or any(not 0 <= b < self.num_layers for b in a.blocks):
                raise ValueError(f"ActionConfig img_hidden_size {a.img_hidden_size!r} / blocks {a.blocks!r} do not "
                                 f"fit a model of dim {self.dim!r} with {self.num_layers!r} layers")
        if self.eps <= 0:
            raise ValueError(f"WanConfig.eps must be > 0, got {self.eps!r}")
        if self.sink_frames < 0:
            raise ValueError(f"WanConfig.sink_frames must be >= 0, got {self.sink_frames!r}")
        if self.window_frames < 1:
            raise ValueError(f"WanConfig.window_frames must be >= 1, got {self.window_frames!r}")
        if not self.timesteps:
            raise ValueError("WanConfig.timesteps is empty")
        for name, ts in (("timesteps", self.timesteps), *(("fewer_steps", f) for f in self.fewer_steps)):
            for t in ts:
                if not 0 < t <= self.num_train_timesteps:
                    raise ValueError(f"WanConfig.{name} {ts!r}: {t!r} is outside (0, {self.num_train_timesteps}]")
        counts = [len(ts) for ts in self.step_lists]
        if min(counts) < 1 or len(set(counts)) != len(counts) or max(counts) != counts[0]:
            raise ValueError(f"WanConfig.fewer_steps {self.fewer_steps!r}: each list non-empty, shorter than "
                             f"timesteps {self.timesteps!r}, and of its own length")
        if self.sampler == "rolling" and self.fewer_steps:
            raise ValueError(f"WanConfig.fewer_steps {self.fewer_steps!r}: the rolling sampler's steps are its "
                             "window's levels; it has no other list")
        if not self.fps > 0:
            raise ValueError(f"WanConfig.fps must be > 0, got {self.fps!r}")
        if not 0 <= self.commit_timestep < self.num_train_timesteps:
            raise ValueError(
                f"WanConfig.commit_timestep {self.commit_timestep!r} is outside [0, {self.num_train_timesteps})")
        if self.shift <= 0:
            raise ValueError(f"WanConfig.shift must be > 0, got {self.shift!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"WanConfig.positions {self.positions!r}: one of {', '.join(POSITIONS)}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"WanConfig.sampler {self.sampler!r}: one of {', '.join(SAMPLERS)}")
        if self.sampler == "rolling" and (self.positions != "absolute" or self.sink_frames != self.chunk_frames
                                          or self.window_frames < self.chunk_frames * len(self.timesteps)):
            raise ValueError(
                f"WanConfig.sampler 'rolling' needs absolute positions, one chunk of sinks (its anchor) and a "
                f"window holding the in-flight window: positions {self.positions!r}, sink_frames "
                f"{self.sink_frames!r}, window_frames {self.window_frames!r}, chunk_frames {self.chunk_frames!r}")
        if self.long_mode not in LONG_MODES:
            raise ValueError(f"WanConfig.long_mode {self.long_mode!r}: one of {', '.join(LONG_MODES)}")
        if self.long_mode == "restart" and self.sink_frames:
            raise ValueError(f"WanConfig.long_mode 'restart' starts each rollout afresh: sink_frames "
                             f"{self.sink_frames!r} must be 0")

    # --- derived ---
    @property
    def cond_dim(self) -> int:
        """Channels of the image condition an i2v model takes beside its latents: a 4-channel
        mask (1 at the image's latent frame) and the image's latent (out_dim); 0 for t2v."""
        return COND_MASK_CHANNELS + self.out_dim if self.model_type == "i2v" else 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def rope_pairs(self) -> tuple[int, int, int]:
        """Rotary pairs of the head dim given to (frame, height, width), in that order: Wan gives
        height and width a third each (rounded down) and time the rest."""
        c = self.head_dim // 2
        return (c - 2 * (c // 3), c // 3, c // 3)

    @property
    def ring_frames(self) -> int:
        """Committed frames a session's cache holds after the sinks: the window, or a whole chunk
        where the window is shorter (Matrix-Game's gta_drive reads 1 frame before a chunk of 3)."""
        return max(self.window_frames, self.chunk_frames)

    @property
    def cache_frames(self) -> int:
        """Latent frames a session's KV cache holds: sinks plus ring."""
        return self.sink_frames + self.ring_frames

    @property
    def rollout_frames(self) -> int:
        """Latent frames of one rollout of the "restart" long mode: the chunk and the window before
        it (CausVid's 21); the last chunk of each is the next one's overlap."""
        return self.window_frames + self.chunk_frames

    @property
    def patch_dim(self) -> int:
        """Output values one token writes: out_dim * prod(patch_size)."""
        return self.out_dim * math.prod(self.patch_size)

    def tokens_per_frame(self, height: int, width: int) -> int:
        """Tokens in one latent frame of ``height`` x ``width`` latents (1560 at 60x104)."""
        ph, pw = self.patch_size[1:]
        if height % ph or width % pw or height < 1 or width < 1:
            raise ValueError(f"latent size {height}x{width} is not a positive multiple of the patch {ph}x{pw}")
        return (height // ph) * (width // pw)

    def sigma(self, timestep: float) -> float:
        """Noise level of a model timestep: x_t = (1 - sigma) x0 + sigma * noise."""
        return timestep / self.num_train_timesteps

    def warp(self, t: float) -> float:
        """A schedule step mapped onto the shifted schedule, as a model timestep."""
        s = t / self.num_train_timesteps
        return self.num_train_timesteps * self.shift * s / (1 + (self.shift - 1) * s)

    @property
    def step_timesteps(self) -> tuple[float, ...]:
        """The model timesteps of the denoising steps (1000, 937.5, 833.3, 625 for Self-Forcing)."""
        return self.model_timesteps(self.timesteps)

    @property
    def step_lists(self) -> tuple[tuple[float, ...], ...]:
        """Every step list the checkpoint was trained for, most steps first (before warping)."""
        return (self.timesteps, *self.fewer_steps)

    @property
    def schedules(self) -> tuple[tuple[float, ...], ...]:
        """The model timesteps of each trained step list, most steps first."""
        return tuple(self.model_timesteps(ts) for ts in self.step_lists)

    def model_timesteps(self, steps: tuple[float, ...]) -> tuple[float, ...]:
        """``steps`` as the model sees them: warped onto the shifted schedule where the recipe warps."""
        return tuple(self.warp(t) if self.warp_timesteps else float(t) for t in steps)

    # --- presets and files ---
    @classmethod
    def wan_1_3b(cls, **recipe: Any) -> WanConfig:
        """Wan2.1-T2V-1.3B, the backbone of Self-Forcing, CausVid, LongLive and Rolling Forcing."""
        return cls(**recipe)

    @classmethod
    def tiny(cls, **kw: Any) -> WanConfig:
        """A few-thousand-parameter model with the real one's structure, for tests on a CPU."""
        base: dict[str, Any] = dict(
            dim=48, ffn_dim=96, freq_dim=16, text_dim=24, in_dim=4, out_dim=4, num_heads=2,
            num_layers=2, text_len=8, chunk_frames=2, sink_frames=1, window_frames=4,
        )
        base.update(kw)
        return cls(**base)

    @classmethod
    def matrix_game_2(cls, variant: str = "universal", **recipe: Any) -> WanConfig:
        """Matrix-Game 2.0 as its authors publish it: Wan2.1-1.3B (from SkyReels-V2-I2V-1.3B) with
        36 input channels, cross-attention over CLIP image tokens, action modules in blocks
        0-14, and the variant's recipe (model/wan/recipes.py: chunks of 3 latent frames, no sinks,
        1000, 666, 333 warped with shift 5; templerun 1000, 750, 500, 250). ``variant``: "universal"
        (keyboard W/S/A/D + mouse), "gta_drive" (W/S + mouse), "templerun" (7 one-hot keys, no mouse)."""
        try:
            keyboard, mouse = MATRIX_GAME_VARIANTS[variant]
        except KeyError:
            known = ", ".join(MATRIX_GAME_VARIANTS)
            raise ValueError(f"unknown Matrix-Game variant {variant!r}; known: {known}") from None
        base: dict[str, Any] = dict(
            model_type="i2v", in_dim=36, **recipes.get("matrix-game-2-" + variant.replace("_", "-")).config_fields(),
            action_config=ActionConfig(keyboard_dim_in=keyboard, enable_mouse=mouse),
        )
        base.update(recipe)
        return cls(**base)

    @classmethod
    def tiny_matrix_game(cls, **kw: Any) -> WanConfig:
        """Matrix-Game's structure at a few thousand parameters, for tests on a CPU: 4 latent
        channels (12 in with the condition), action modules in block 0 of 2, 2 action heads."""
        base: dict[str, Any] = dict(
            dim=48, ffn_dim=96, freq_dim=16, text_dim=24, in_dim=12, out_dim=4, num_heads=2, num_layers=2,
            image_dim=20, model_type="i2v", chunk_frames=2, sink_frames=0, window_frames=2,
            timesteps=(1000.0, 666.0, 333.0),
            action_config=ActionConfig(
                blocks=(0,), heads_num=2, hidden_size=8, img_hidden_size=48, keyboard_dim_in=4,
                keyboard_hidden_dim=16, mouse_dim_in=2, mouse_hidden_dim=16, mouse_qk_dim_list=(4, 2, 2),
                rope_dim_list=(4, 2, 2), windows_size=3,
            ),
        )
        base.update(kw)
        return cls(**base)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], **overrides: Any) -> WanConfig:
        """Build from a config dict with Wan's key names (``dim``, ``num_heads``, ...) or diffusers'
        (``num_attention_heads``, ``attention_head_dim``, ``in_channels``, ...), plus optional
        recipe keys under the house's names or the authors' training-config names."""
        known = {f.name for f in fields(cls)}
        out: dict[str, Any] = {k: v for k, v in raw.items() if k in known}
        if "num_attention_heads" in raw:  # diffusers' WanTransformer3DModel config
            heads = int(raw["num_attention_heads"])
            out["num_heads"] = heads
            if "attention_head_dim" in raw:
                out["dim"] = heads * int(raw["attention_head_dim"])
        for theirs, ours in _ALIASES.items():
            if theirs in raw and ours not in raw:
                out[ours] = raw[theirs]
        if "local_attn_size" in raw and "window_frames" not in raw and int(raw["local_attn_size"]) > 0:
            # Self-Forcing / LongLive count the attended frames including sinks and the chunk itself.
            sinks = int(out.get("sink_frames", overrides.get("sink_frames", cls.sink_frames)))
            chunk = int(out.get("chunk_frames", overrides.get("chunk_frames", cls.chunk_frames)))
            out["window_frames"] = int(raw["local_attn_size"]) - sinks - chunk
        if "patch_size" in out:
            out["patch_size"] = tuple(int(p) for p in out["patch_size"])
        if isinstance(out.get("action_config"), dict):  # Matrix-Game's; an empty one means none
            out["action_config"] = ActionConfig.from_dict(out["action_config"]) if out["action_config"] else None
        if "timesteps" in out:  # the authors' lists may end with the final 0
            out["timesteps"] = tuple(float(t) for t in out["timesteps"] if float(t) != 0)
        if "fewer_steps" in out:
            out["fewer_steps"] = tuple(tuple(float(t) for t in ts if float(t) != 0) for ts in out["fewer_steps"])
        out.update(overrides)
        return cls(**out)

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> WanConfig:
        """Read an authors' ``config.json`` (see ``from_dict``); ``overrides`` win over the file."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"Wan config {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"Wan config {path} is not valid JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"Wan config {path} holds a {type(raw).__name__}, not an object")
        try:
            return cls.from_dict(raw, **overrides)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Wan config {path}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.action_config is not None:
            out["action_config"] = asdict(self.action_config)
        return out

    def with_recipe(self, **recipe: Any) -> WanConfig:
        return replace(self, **recipe)


POSITIONS = ("rank", "absolute")  # the time position schemes of model/wan/cache.py
SAMPLERS = ("chunk", "rolling")  # one chunk through every step, or Rolling Forcing's window (model/wan/rolling.py)
LONG_MODES = ("rolling", "restart")  # what a session does past its cache: roll the window, or restart
COND_MASK_CHANNELS = 4  # Matrix-Game's condition mask: the first 4 channels of a latent-shaped mask

# variant -> (keyboard_dim_in, enable_mouse), as the authors' configs/distilled_model/<variant>/config.json
# say; the rest of each variant's settings is its recipe's (model/wan/recipes.py)
MATRIX_GAME_VARIANTS: dict[str, tuple[int, bool]] = {
    "universal": (4, True),
    "gta_drive": (2, True),
    "templerun": (7, False),
}

# Other names for the same fields: diffusers' transformer config and the authors' training configs
# (local_attn_size counts sinks, window and chunk together: from_dict converts it)
_ALIASES = {
    "in_channels": "in_dim",
    "out_channels": "out_dim",
    **{k: v for k, v in recipes.AUTHORS_NAMES.items() if k != "local_attn_size"},
}
