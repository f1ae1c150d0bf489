"""Rolling Forcing's sampler: a window of blocks at staggered noise levels, one forward a tick.

Rolling Forcing (TencentARC/RollingForcing, ``pipeline/rolling_forcing_inference.py``) keeps a
window of up to 5 blocks of 3 latent frames in flight. Block b has been through ``k - b`` passes
at tick k, so the window, oldest first, sits at the recipe's steps from the last to the first::

    tick k:   block k-4      k-3      k-2      k-1      k (fresh noise)
    level     555.6          769.2    882.4    952.4    1000          (1000, 800, 600, 400, 200 warped)

One forward denoises the whole window at once, full attention inside it, reading the anchor
(block 0, the cache's sinks, moved to sit just before the latest committed block) and that block
(``WanKVCache.chunk(anchor=True)``). Each block's clean guess x0 is noised again with fresh noise
to its next level, but the oldest: it is done, committed at t = 0 into the clean cache (reading
the latest 18 committed frames, as a chunk of the other samplers does) and emitted. A session's
first block takes 5 ticks (the window filling from the newest end); it runs them in one go, so
every block after it costs one tick and goes out as 12 pixel frames.

What a session keeps between ticks (``InFlight``): the 4 blocks after the one just emitted, each
at its next level. Snapshots carry them (``pack``/``unpack``); the noise each tick draws comes
from the session's generator: the new block's, then each kept block's, oldest first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from worldserve.model.wan.cache import WanKVCache
from worldserve.model.wan.causal import CausalWanModel, TextKV
from worldserve.session.family_state import entry


@dataclass(slots=True)
class InFlight:
    """A session's blocks in Rolling Forcing's window between ticks."""

    latents: torch.Tensor  # (C, m*F, h, w) float32: the m noisy blocks, oldest first, block j at level m - j

    @property
    def frames(self) -> int:
        return self.latents.shape[1]


Noise = Callable[[int], torch.Tensor]  # row b -> one block's fresh noise (C, F, h, w) from that session's generator


@torch.no_grad()
def tick(model: CausalWanModel, cache: WanKVCache, slots: list[int], text: TextKV, flights: Sequence[InFlight],
         noise: Noise) -> tuple[list[InFlight], torch.Tensor | None]:
    """One window forward for a batch of sessions holding the same number m of blocks in flight
    (``flights``, rows as ``slots``): the new block from noise, every block one level on; with m
    the last level's index, the oldest block is committed and its x0 (B, C, F, h, w) returned."""
    cfg, f, steps = model.cfg, model.cfg.chunk_frames, model.cfg.step_timesteps
    m = flights[0].frames // f
    if any(fl.frames != m * f for fl in flights) or m >= len(steps):
        raise ValueError(f"a rolling batch holds {[fl.frames for fl in flights]} frames in flight; "
                         f"all alike, under {len(steps) * f}")
    b = len(flights)
    x = torch.stack([torch.cat((fl.latents, noise(i)), 1) for i, fl in enumerate(flights)])  # (B, C, (m+1)F, h, w)
    levels = torch.tensor([steps[m - j] for j in range(m + 1)], device=x.device).repeat_interleave(f)
    t = levels[None].expand(b, -1)  # (B, (m+1)F) oldest block at the highest step index
    v = model.denoise(x, t, text, cache.chunk(slots, num_frames=(m + 1) * f, anchor=True))
    x0 = x - (t / cfg.num_train_timesteps)[:, None, :, None, None] * v
    done = m == len(steps) - 1
    kept = []
    for i in range(b):
        parts = []
        for j in range(1 if done else 0, m + 1):
            sigma = cfg.sigma(steps[m - j + 1])
            parts.append((1 - sigma) * x0[i, :, j * f:(j + 1) * f] + sigma * noise(i))
        kept.append(InFlight(torch.cat(parts, 1)))
    if not done:
        return kept, None
    oldest = x0[:, :, :f].contiguous()
    model.commit(oldest, text, cache.chunk(slots))
    return kept, oldest


def first_block(model: CausalWanModel, cache: WanKVCache, slots: list[int], text: TextKV, noise: Noise
                ) -> tuple[list[InFlight], torch.Tensor]:
    """A batch of sessions' first ticks, until their first block is done: its x0 (B, C, F, h, w)."""
    c, f = model.cfg.out_dim, model.cfg.chunk_frames
    flights = [InFlight(torch.zeros(c, 0, cache.height, cache.width, device=cache.k.device)) for _ in slots]
    while True:
        flights, x0 = tick(model, cache, slots, text, flights, noise)
        if x0 is not None:
            return flights, x0
        assert flights[0].frames <= len(model.cfg.step_timesteps) * f


def pack(flight: InFlight | None) -> dict[str, np.ndarray]:
    """The family-state entry of a session's blocks in flight (none before its first block)."""
    if flight is None:
        return {}
    return {"rolling_in_flight": flight.latents.float().cpu().numpy()}


def unpack(state: Mapping[str, np.ndarray], channels: int, blocks: int, chunk: int, height: int, width: int,
           device: torch.device) -> InFlight | None:
    """A snapshot's blocks in flight, checked: (C, blocks * chunk, h, w) float32, or absent."""
    arr = entry(state, "rolling_in_flight", "float32", (channels, blocks * chunk, height, width), optional=True,
                family="rolling-forcing")
    return None if arr is None else InFlight(torch.from_numpy(np.ascontiguousarray(arr)).to(device))


class Session(Protocol):
    """What ``run_blocks`` reads and writes of a session (``WanSession``)."""

    slot: int
    text: TextKV
    gen: torch.Generator
    flight: InFlight | None


def run_blocks(model: CausalWanModel, cache: WanKVCache, sessions: Sequence[Session]) -> torch.Tensor:
    """One block for each session: those before their first block run their first ticks together,
    the others one tick together; the blocks' x0 (B, C, F, h, w) in the sessions' order."""
    shape = (model.cfg.out_dim, model.cfg.chunk_frames, cache.height, cache.width)
    out: list[torch.Tensor | None] = [None] * len(sessions)
    phases = [s.flight is None for s in sessions]  # before any group moves on
    for starting in (True, False):
        rows = [i for i, p in enumerate(phases) if p == starting]
        if not rows:
            continue
        group = [sessions[i] for i in rows]
        text = TextKV.cat([s.text for s in group]) if len(group) > 1 else group[0].text
        slots = [s.slot for s in group]

        def noise(b: int, group: list[Session] = group) -> torch.Tensor:
            return torch.randn(shape, generator=group[b].gen, device=cache.k.device)

        if starting:
            flights, x0 = first_block(model, cache, slots, text, noise)
        else:
            flights, done = tick(model, cache, slots, text, [s.flight for s in group if s.flight], noise)
            assert done is not None, "a session past its first block holds a full window"
            x0 = done
        for j, i in enumerate(rows):
            sessions[i].flight, out[i] = flights[j], x0[j]
    return torch.stack([x for x in out if x is not None])
