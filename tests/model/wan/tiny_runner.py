"""A tiny ``WanRunner`` for checks on the latents a recipe serves: a random tiny transformer with
the recipe's settings, prompts that map to fixed random embeddings, and a decoder that only
counts frames (its pixels are black) or a tiny random Wan2.1 VAE. The latents a session generated are read back from the
runner (``latents``); the noise it drew is the session's generator's (``torch.Generator`` seeded
with the session's seed, ``randn`` of one chunk's shape per draw)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tests.model.wan.tiny import LATENT_HEIGHT, LATENT_WIDTH, random_model, tiny_config
from tests.model.wan.tiny_dir import TINY_VAE
from worldserve.model.wan import recipes
from worldserve.model.wan.causal import CausalWanModel
from worldserve.model.wan.recipes import Served
from worldserve.model.wan.runner import VAE_SCALE, WanRunner
from worldserve.model.wan.vae_stream import StreamingDecoder, pixel_frames_for
from worldserve.session.plan import (
    ACTION_DIM,
    Batch,
    ChunkWork,
    SessionSpec,
    SessionUpdate,
    StepPlan,
)

HEIGHT, WIDTH = VAE_SCALE * LATENT_HEIGHT, VAE_SCALE * LATENT_WIDTH
BUCKET = HEIGHT


class Stream:
    def __init__(self) -> None:
        self.frames = 0  # latent frames decoded

    def dispose(self) -> None: ...


class CountingDecoder:
    """The decoding interface with black pixels: frame counts as the Wan2.1 VAE's."""

    def __init__(self, z_dim: int) -> None:
        self.z_dim = z_dim

    def open(self) -> Stream:
        return Stream()

    def decode_batch_float(self, streams: Sequence[Stream], latents: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for s in streams:
            n = pixel_frames_for(s.frames, latents.shape[2])
            s.frames += latents.shape[2]
            out.append(torch.zeros(3, n, latents.shape[3] * VAE_SCALE, latents.shape[4] * VAE_SCALE))
        return out

    def decode_batch(self, streams: Sequence[Stream], latents: torch.Tensor) -> list[torch.Tensor]:
        return [torch.zeros(v.shape[1], v.shape[2], v.shape[3], 3, dtype=torch.uint8)
                for v in self.decode_batch_float(streams, latents)]


class FixedPrompts:
    """A prompt encoder whose embedding of each prompt is fixed random noise."""

    def __init__(self, dim: int, length: int = 5) -> None:
        self.dim, self.length = dim, length
        self._seen: dict[str, torch.Tensor] = {}

    def encode(self, prompt: str) -> torch.Tensor:
        if prompt not in self._seen:
            g = torch.Generator().manual_seed(len(self._seen) + 11)
            self._seen[prompt] = torch.randn(self.length, self.dim, generator=g)
        return self._seen[prompt]


def tiny_vae(seed: int = 1) -> StreamingDecoder:
    """The Wan2.1 VAE's layout at base width 4 (tests/model/wan/tiny_dir.py), random weights."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**TINY_VAE)
    with torch.no_grad():  # a random decoder that draws something (not a flat grey)
        for p in vae.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return StreamingDecoder(vae.eval())


def tiny_runner(recipe: str, seed: int = 0, vae: bool = False, **overrides: Any) -> WanRunner:
    """A runner serving ``recipe``'s settings (with ``overrides``) on a random tiny model;
    ``vae``: decoding with a tiny random Wan2.1 VAE instead of counting frames."""
    r = recipes.get(recipe)
    cfg = tiny_config(**{**r.config_fields(), **overrides})
    model: CausalWanModel = random_model(cfg, seed=seed)
    decoder = tiny_vae() if vae else CountingDecoder(cfg.out_dim)
    return WanRunner(model, decoder, FixedPrompts(cfg.text_dim),  # type: ignore[arg-type]
                     sizes=((HEIGHT, WIDTH),), max_sessions=2, served=Served(r))


def run(runner: WanRunner, sid: str, prompts: dict[int, str], chunks: int, seed: int = 1) -> torch.Tensor:
    """Open ``sid`` with ``prompts[0]`` and generate ``chunks`` chunks, switching to
    ``prompts[c]`` before chunk c; returns the latest ``chunk_frames`` latent frames the session
    holds after each chunk (C, N, h, w): what it generated, or after a restart the overlap."""
    return run_frames(runner, sid, prompts, chunks, seed)[0]


def run_frames(runner: WanRunner, sid: str, prompts: dict[int, str], chunks: int, seed: int = 1
               ) -> tuple[torch.Tensor, np.ndarray]:
    """``run``'s latents and the pixel frames the chunks went out as (N', H, W, 3) uint8."""
    plan = StepPlan(new_sessions=[SessionSpec(sid, BUCKET, seed=seed, scene=prompts[0])])
    frames: list[torch.Tensor] = []
    pixels: list[np.ndarray] = []
    for c in range(chunks):
        if c in prompts and c:
            plan.updates.append(SessionUpdate(sid, scene=prompts[c]))
        act = np.zeros((runner.frames_per_chunk, ACTION_DIM), np.float32)
        plan.batches.append(Batch(BUCKET, runner.max_steps, [ChunkWork(sid, c, act)]))
        out = runner.execute(plan)
        assert not out.errors, out.errors
        s = runner.sessions[sid]
        frames.append(torch.stack([*s.sinks, *s.recent][-runner.cfg.chunk_frames:], 1))  # the chunk's
        pixels.extend(r.frames for r in out.results)
        plan = StepPlan()
    return torch.cat(frames, 1), np.concatenate(pixels)
