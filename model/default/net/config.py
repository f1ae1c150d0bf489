"""One config for the causal few-step world model: every shape, validated, with derived sizes.

The model works in pixel space on square frames. A resolution bucket is the output side
length in pixels; every bucket shows the same field of view, so a bigger bucket has more
tokens per frame (``(bucket / patch) ** 2``), not a bigger view.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

# settings of the sampler alone: a runner may override them on trained weights
SAMPLER_FIELDS = ("denoising_steps", "sampler_eta", "reference_trust")

# switches of trials that were not adopted, removed from the model (docs/long_rollout.md), and
# the value at which each was off: a config written before their removal loads where it holds
# exactly that value, and names the trial where it does not
RETIRED_FIELDS: dict[str, object] = {
    "renoise": 1.0, "commit_noise": 0.0, "motion_layers": 1,
    "canvas_memory": False, "refine_channels": 0, "recall_patch": 0, "unet_width": 0,
    "anchor_warp": True,  # every model copies from its anchor reference (model/default/reference/anchor.py)
}


@dataclass(frozen=True)
class ModelConfig:
    # --- frames and tokens ---
    buckets: tuple[int, ...] = (64, 128)  # output side lengths in pixels, smallest first
    base_bucket: int = 64  # bucket whose token grid defines spatial position units
    patch: int = 16  # pixels per token side, every bucket
    channels: int = 3  # RGB
    # --- transformer ---
    width: int = 192  # model dimension
    depth: int = 4  # transformer blocks
    heads: int = 3  # attention heads; head_dim = width / heads
    mlp_ratio: float = 4.0  # MLP hidden = mlp_ratio * width
    time_rope_dims: int = 16  # head dims rotated by frame time; the rest split over (y, x)
    rope_theta: float = 100.0  # RoPE base; positions are small (tokens, frames)
    # --- causal structure ---
    frames_per_chunk: int = 1  # frames generated per chunk
    sink_frames: int = 1  # first frames of an epoch, kept for the whole epoch
    window_frames: int = 4  # last committed frames kept in the rolling window
    # --- few-step sampler (flow matching, clean-sample prediction) ---
    denoising_steps: int = 4  # default steps; levels for n steps are 1, (n-1)/n, ..., 1/n
    min_steps: int = 1  # fewest steps the degradation ladder may ask for
    # share of fresh noise between steps (0: the guess's own noise, the Euler step; 1: all fresh)
    sampler_eta: float = 0.0
    # --- conditioning ---
    num_keys: int = 4  # multi-hot movement keys (forward, back, left, right)
    mouse_dims: int = 2  # continuous mouse / camera delta
    scene_dim: int = 18  # scene conditioning vector length (world.scene.SCENE_DIM)
    # --- output head ---
    motion_radius: int = 5  # max shift (pixels at base_bucket) of the per-token motion kernels
    reference_trust: float = 0.0  # logits added to the head's reference mix (serving; ``WorldModel._head``)
    # --- the world state of what moves, carried beside the reference ---
    state_channels: int = 0  # channels of the live state (actors, clouds, fog) after the reference; 0: none
    state_basis: int = 0  # learned per-pixel shape features per kind of actor (``net/state_draw.py``); 0: none

    def __post_init__(self) -> None:
        if not self.buckets:
            raise ValueError("buckets must name at least one resolution, got ()")
        if tuple(sorted(self.buckets)) != tuple(self.buckets):
            raise ValueError(f"buckets must be sorted ascending, got {self.buckets}")
        for b in self.buckets:
            if b % self.patch:
                raise ValueError(f"bucket {b} is not a multiple of patch {self.patch}")
            if b % self.base_bucket and self.base_bucket % b:
                raise ValueError(f"bucket {b} and base_bucket {self.base_bucket} must divide one another")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")
        spatial = self.head_dim - self.time_rope_dims
        if self.time_rope_dims % 2 or spatial <= 0 or spatial % 4:
            raise ValueError(
                f"time_rope_dims {self.time_rope_dims} must be even and leave a positive multiple "
                f"of 4 of head_dim {self.head_dim} for the (y, x) rotations"
            )
        for name in ("depth", "frames_per_chunk", "sink_frames", "window_frames", "denoising_steps",
                     "min_steps", "channels", "num_keys"):
            if getattr(self, name) < (0 if name == "sink_frames" else 1):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.min_steps > self.denoising_steps:
            raise ValueError(f"min_steps {self.min_steps} > denoising_steps {self.denoising_steps}")
        if self.window_frames < self.frames_per_chunk:
            raise ValueError(
                f"window_frames {self.window_frames} must hold a whole chunk of {self.frames_per_chunk}"
            )
        if not 0.0 <= self.sampler_eta <= 1.0:
            raise ValueError(f"sampler_eta must lie in [0, 1], got {self.sampler_eta}")
        if not 0.0 <= self.reference_trust < float("inf"):
            raise ValueError(f"reference_trust must be a finite number >= 0, got {self.reference_trust}")
        if self.state_channels < 0:
            raise ValueError(f"state_channels must be >= 0, got {self.state_channels}")
        if self.state_basis < 0 or (self.state_basis and not self.state_channels):
            raise ValueError(f"state_basis {self.state_basis} needs state_channels and must be >= 0")
        if self.motion_radius < 0 or self.motion_radius > self.patch:
            raise ValueError(f"motion_radius {self.motion_radius} must lie in [0, patch={self.patch}]")

    # --- derived sizes ---
    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def action_dim(self) -> int:
        return self.num_keys + self.mouse_dims

    @property
    def prev_channels(self) -> int:
        """Channels of a frame's ``prev`` input: the previous frame, then the reference (its
        colours, zero where it shows nothing, and a validity mask), then the live state's
        ``state_channels`` (``model/default/reference/live/``)."""
        return self.reference_channels + self.state_channels

    @property
    def reference_channels(self) -> int:
        """Channels of ``prev`` up to the live state: the previous frame and the reference."""
        return 2 * self.channels + 1

    @property
    def cache_frames(self) -> int:
        """Frames a session's KV cache holds: sinks then the rolling window."""
        return self.sink_frames + self.window_frames

    def grid(self, bucket: int) -> int:
        """Tokens per side of a frame at ``bucket``."""
        self.check_bucket(bucket)
        return bucket // self.patch

    def tokens_per_frame(self, bucket: int) -> int:
        return self.grid(bucket) ** 2

    def tokens_per_chunk(self, bucket: int) -> int:
        return self.frames_per_chunk * self.tokens_per_frame(bucket)

    def kv_cache_tokens(self, bucket: int) -> int:
        return self.cache_frames * self.tokens_per_frame(bucket)

    def radius(self, bucket: int) -> int:
        """Motion kernel radius in pixels at ``bucket`` (scales with pixel density)."""
        return max(1, self.motion_radius * bucket // self.base_bucket)

    def noise_levels(self, steps: int | None = None) -> tuple[float, ...]:
        """Noise levels visited by an ``steps``-step sample: 1, (n-1)/n, ..., 1/n."""
        n = self.denoising_steps if steps is None else steps
        if not self.min_steps <= n <= self.denoising_steps:
            raise ValueError(f"steps {n} outside [{self.min_steps}, {self.denoising_steps}]")
        return tuple((n - i) / n for i in range(n))

    def with_sampler(self, settings: dict[str, Any] | None) -> ModelConfig:
        """This config with sampler settings (``SAMPLER_FIELDS``) replaced: what may change on
        trained weights without training."""
        if not settings:
            return self
        unknown = sorted(set(settings) - set(SAMPLER_FIELDS))
        if unknown:
            raise ValueError(f"not sampler settings: {unknown} (these are: {', '.join(SAMPLER_FIELDS)})")
        return replace(self, **{k: type(getattr(self, k))(v) for k, v in settings.items()})

    def check_bucket(self, bucket: int) -> None:
        if bucket not in self.buckets:
            raise ValueError(f"bucket {bucket} is not one of {self.buckets}")

    # --- serialisation ---
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k not in RETIRED_FIELDS}
        for name in sorted(set(data) & set(RETIRED_FIELDS)):
            if data[name] != RETIRED_FIELDS[name]:
                raise ValueError(
                    f"{name}={data[name]!r} is a path that was removed "
                    f"(only {RETIRED_FIELDS[name]!r}, what ships, loads; see docs/long_rollout.md)"
                )
        unknown = set(kw) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}")
        if "buckets" in kw:
            kw["buckets"] = tuple(kw["buckets"])
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        return cls.from_dict(json.loads(text))
