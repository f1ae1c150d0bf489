"""CausVid's two checkpoints and its long mode at tiny size.

``authors_long_video`` below re-implements, from reading tianweiy/CausVid's
``minimal_inference/longvideo_autoregressive_inference.py`` and ``causal_inference.py``, how the
authors chain rollouts: each rollout runs 21 latent frames (the first chunk of every rollout after
the first committed from ``start_latents`` at timestep 0, not generated), decodes them all at once,
keeps its video up to the overlap's pixels, and starts the next from the last pixel frame of its
frame 18 re-encoded as a video's first frame, followed by its latent frames 19 and 20. The
network, the cache within a rollout and the sampler are the model's own (``test_reference.py``
checks them against the authors' network and global attention).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.model.wan.test_recipes import published, served
from tests.model.wan.tiny import LATENT_HEIGHT as H
from tests.model.wan.tiny import LATENT_WIDTH as W
from tests.model.wan.tiny_runner import run_frames, tiny_runner
from worldserve.model.wan import recipes
from worldserve.model.wan.cache import WanKVCache
from worldserve.model.wan.runner import WanRunner
from worldserve.model.wan.sampler import generate_chunk
from worldserve.model.wan.vae_stream import to_uint8_frames

# tianweiy/CausVid @ca21150: configs/wan_causal_dmd_warp_4step_cfg2.yaml (the 4-step checkpoint trained with warp)
CAUSVID_WARP4 = {"denoising_step_list": [1000, 750, 500, 250, 0], "timestep_shift": 8.0, "num_frame_per_block": 3,
                 "warp_denoising_step": True}
OVERLAP = 3  # longvideo_autoregressive_inference.py's num_overlap_frames default


def test_causvid_warp4_is_its_config_warped_with_shift_8_and_loads_its_generator():
    r, cfg, want = recipes.get("causvid-warp4"), served("causvid-warp4"), published(CAUSVID_WARP4)
    for k in ("timesteps", "warp_timesteps", "shift", "chunk_frames", "sink_frames"):
        assert getattr(cfg, k) == getattr(want, k), k
    assert cfg.step_timesteps == pytest.approx((1000.0, 960.0, 888.888889, 727.272727))
    assert r.checkpoint_key == "generator" and r.checkpoint.path.endswith("model.pt")
    assert r.checkpoint.path != recipes.get("causvid").checkpoint.path
    assert cfg.window_frames + cfg.chunk_frames == 21 and cfg.long_mode == "restart"


@torch.no_grad()
def authors_long_video(runner: WanRunner, prompt: str, rollouts: int, seed: int = 1
                       ) -> tuple[torch.Tensor, np.ndarray]:
    """The authors' long video with the runner's model, VAE, prompt and noise (one chunk's randn a
    draw from the session's generator, generated chunks only): the latent frames of each chunk
    in the order the runner holds them (a rollout's last chunk replaced by the next rollout's
    overlap) and the video's pixel frames (uint8)."""
    model, cfg, vae = runner.model, runner.cfg, runner.decoder
    text = runner._text_kv(prompt)
    gen = torch.Generator().manual_seed(seed)
    f, chunks = cfg.chunk_frames, cfg.rollout_frames // cfg.chunk_frames
    start: torch.Tensor | None = None
    held: list[torch.Tensor] = []
    video: list[torch.Tensor] = []
    for _ in range(rollouts):
        cache = WanKVCache.create(cfg, H, W, slots=1)
        slot = cache.allocate()
        out: list[torch.Tensor] = []
        for c in range(chunks):
            if start is not None and c == 0:  # the overlap: committed at timestep 0
                model.commit(start[None], text, cache.chunk([slot]))
                out.append(start)
                continue
            noise = torch.randn((cfg.out_dim, f, H, W), generator=gen)[None]
            out.append(generate_chunk(model, cache.chunk([slot]), text, noise, generator=gen)[0])
        latents = torch.cat(out, 1)  # (C, 21, h, w)
        pixels = vae.decode_batch_float([vae.open()], latents[None])[0].clamp(-1, 1)  # (3, 81, H, W)
        cut = 4 * (OVERLAP - 1) + 1
        first = vae.encode_video(pixels[:, -cut:-cut + 1])
        start = torch.cat((first, latents[:, -(OVERLAP - 1):]), 1)
        video.append(to_uint8_frames(pixels)[:-cut])
        held.extend([*out[int(bool(held)):-1], start])
    return torch.cat(held, 1), torch.cat(video).numpy()


def test_causvid_past_its_rollout_restarts_from_the_re_encoded_overlap_as_its_long_video_does():
    """A rollout of 9 latent frames here (a window of 6: the tiny VAE decodes slowly on a CPU; the
    recipe's is 21), 4 chunks: a restart after latent frame 8, every chunk 12 pixel frames after
    the first's 9, the frames of the authors' long video in order."""
    runner = tiny_runner("causvid", vae=True, window_frames=6)
    assert runner.cfg.long_mode == "restart" and runner.cfg.rollout_frames == 9
    chunks = 4
    latents, frames = run_frames(runner, "s", {0: "a red fox"}, chunks)
    want_latents, want_frames = authors_long_video(runner, "a red fox", 2)
    assert frames.shape[0] == 9 + 12 * (chunks - 1) and frames.std() > 1  # pictures, not a flat fill
    torch.testing.assert_close(latents, want_latents[:, :latents.shape[1]], atol=1e-4, rtol=1e-4)
    diff = np.abs(frames.astype(int) - want_frames[:frames.shape[0]].astype(int))
    assert diff.max() <= 1, diff.reshape(frames.shape[0], -1).max(1)
    assert runner.sessions["s"].frame_index == 6  # rollout 1's overlap and first generated chunk


def test_causvid_s_rolling_option_rolls_its_window_past_the_rollout_instead():
    restart = tiny_runner("causvid", vae=True, window_frames=6)
    rolling = tiny_runner("causvid", window_frames=6, long_mode="rolling")
    a = run_frames(restart, "s", {0: "a red fox"}, 5)[0]
    b = run_frames(rolling, "s", {0: "a red fox"}, 5)[0]
    err = (a - b).abs().amax(dim=(0, 2, 3))  # (15,) by latent frame
    assert err[:6].max() < 1e-5 and err[7:9].max() < 1e-5  # rollout 0, and the overlap's kept frames
    assert err[6] > 1e-3 and err[9:].min() > 1e-3  # the re-encoded frame, and the next rollout
    assert rolling.sessions["s"].frame_index == 15 and restart.sessions["s"].frame_index == 3  # restarted twice
