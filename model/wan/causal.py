"""The Wan2.1 causal transformer (API published first; bodies follow).

Per chunk, the runner calls::

    text = model.text_kv(context)                   # once per prompt, kept per session
    ctx = cache.chunk(slots)                        # once per chunk (host-side cursors)
    x0 = generate_chunk(model, ctx, text, noise)    # model/wan/sampler.py: steps + commit
      # = for each step: v = model.denoise(x_t, t, text, ctx); x0 = x_t - sigma * v; renoise
      #   then model.commit(x0, text, ctx)           # writes the chunk's K/V, advances cursors

and on a prompt change or a migration: ``model.recache(cache, slot, latents, frame_ids, text)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.wan.cache import ChunkContext, WanKVCache
from model.wan.config import WanConfig


@dataclass(slots=True)
class TextKV:
    """Cross-attention keys and values of a batch of prompts, every layer: computed once per
    prompt by ``CausalWanModel.text_kv`` and passed to every step."""

    k: torch.Tensor  # (L, B, text_len, H, D)
    v: torch.Tensor  # (L, B, text_len, H, D)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @staticmethod
    def cat(parts: Sequence[TextKV]) -> TextKV:
        """Stack the prompts of several sessions into one batch (rows in the given order)."""
        return TextKV(torch.cat([p.k for p in parts], 1), torch.cat([p.v for p in parts], 1))

    def row(self, b: int) -> TextKV:
        """The prompt of batch row ``b`` as a batch of one."""
        return TextKV(self.k[:, b:b + 1], self.v[:, b:b + 1])


class CausalWanModel(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.cfg = cfg

    def text_kv(self, context: torch.Tensor | Sequence[torch.Tensor]) -> TextKV:
        """Cross-attention K/V of prompts: ``context`` (B, L<=text_len, text_dim) or a list of
        (L_i, text_dim) embeddings, zero-padded to text_len as Wan does."""
        raise NotImplementedError

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, text: TextKV, ctx: ChunkContext) -> torch.Tensor:
        """Flow prediction v = noise - x0 for a batch of chunks, without writing the cache.

        x_t (B, C, F, H, W) latents; t (B,) or (B, F) model timesteps (per frame); text with
        B rows; ctx from ``cache.chunk``. Returns (B, out_dim, F, H, W)."""
        raise NotImplementedError

    def commit(self, x0: torch.Tensor, text: TextKV, ctx: ChunkContext) -> None:
        """Run the clean chunk at ``cfg.commit_timestep`` and write its K/V into each row's slot;
        the slots' cursors advance by the chunk's frames."""
        raise NotImplementedError

    def recache(self, cache: WanKVCache, slot: int, latents: torch.Tensor, frame_ids: Sequence[int] | np.ndarray,
                text: TextKV) -> None:
        """Rebuild one slot's cache from clean latent frames under (new) text K/V: the slot is
        emptied, then the frames are committed chunk by chunk, grouped as they were generated
        (by ``frame // chunk_frames``). latents (C, N, H, W); frame_ids (N,) ascending epoch
        frame indices (the sinks then the window, as ``cache.held_frames(slot)`` lists them);
        text with one row. Afterwards the slot expects frame ``frame_ids[-1] + 1``."""
        raise NotImplementedError
