"""Matrix-Game's image condition equals the authors' full-length encode of [image, blank...]
at every latent frame, however long the stream runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan

from tests.model.wan.tiny_dir import TINY_VAE
from worldserve.model.wan.config import COND_MASK_CHANNELS
from worldserve.model.wan.matrix_game import COND_FRAMES, condition_frames, image_condition
from worldserve.model.wan.vae_stream import StreamingDecoder

FRAMES = 60  # latent frames checked: twice the encoder's reach


@pytest.fixture(scope="module")
def decoder() -> StreamingDecoder:
    torch.manual_seed(1)
    vae = AutoencoderKLWan(**TINY_VAE)  # the Wan2.1 VAE's layout at base width 4
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return StreamingDecoder(vae.eval())


def authors_condition(decoder: StreamingDecoder, image: np.ndarray, frames: int) -> torch.Tensor:
    """The authors' way: the whole video of the rollout, the image then blank frames, encoded at once."""
    h, w = image.shape[:2]
    video = torch.zeros(3, 1 + 4 * (frames - 1), h, w)
    video[:, 0] = torch.from_numpy(image).permute(2, 0, 1).float() / 127.5 - 1
    return decoder.encode_video(video)  # (C, frames, h/8, w/8)


def test_the_condition_equals_a_full_length_encode_for_every_latent_frame(decoder):
    image = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    cond = image_condition(decoder, image)
    full = authors_condition(decoder, image, FRAMES)
    for m in range(FRAMES):
        got = condition_frames(cond, m, 1)[:, 0]
        assert torch.equal(got[COND_MASK_CHANNELS:], full[:, m]), f"latent frame {m}"
        assert bool((got[:COND_MASK_CHANNELS] == (1.0 if m == 0 else 0.0)).all()), f"mask at latent frame {m}"
    # the image reaches far: the frames a short encode would have cut differ from the last one
    assert not torch.equal(full[:, 8], full[:, COND_FRAMES - 1])
