"""CausVid's long mode: past one rollout, a new rollout starts from a re-encoded overlap.

CausVid generates a rollout of 21 latent frames (81 pixel frames) attending to all of them; its
long videos (``minimal_inference/longvideo_autoregressive_inference.py``, overlap 3) chain
rollouts. The last chunk of a rollout becomes the next rollout's first, committed at timestep 0
instead of generated: its first latent frame re-encoded from the last pixel frame that frame
decodes to (as a video's first frame, which the VAE encodes alone), the others as they are. Each
rollout's video ends before that overlap's pixels, and the next one's decode (from a fresh
decoder) goes on from there: 72 new pixel frames a rollout, 18 latent frames.

Served chunk by chunk, the chunk that ends a rollout (its latent frames 18-20 for CausVid) goes
out as the 3 pixel frames its first latent frame decodes to before the last, then the overlap's
9 pixel frames from a fresh stream: 12, as every chunk after the first, and the frames of the
authors' long video in order. The slot's cache restarts with the overlap at frames 0-2::

    rollout r:    | chunk 0 | chunk 1 | ... | chunk 6 (frames 18 19 20)            |
    pixels out:     9 (r=0)   12        ...   3 of frame 18 | 9 of the overlap's    |
    rollout r+1:  | overlap = [encode(last pixel of 18), 19, 20] (committed) | chunk 1 | ...

``WanRunner`` calls ``restart`` once a chunk has filled a rollout (``cfg.rollout_frames``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

import torch

from worldserve.model.wan.cache import WanKVCache
from worldserve.model.wan.causal import CausalWanModel, TextKV
from worldserve.model.wan.vae_stream import StreamingDecoder, VaeStream, to_uint8_frames

if TYPE_CHECKING:
    from worldserve.model.wan.tae import TaeDecoder, TaeStream

Decoder = Union[StreamingDecoder, "TaeDecoder"]


@torch.inference_mode()
def restart(
    model: CausalWanModel, decoder: Decoder, cache: WanKVCache, slot: int, stream: VaeStream | TaeStream,
    text: TextKV, chunk: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, VaeStream | TaeStream]:
    """The rollout that ``chunk`` (C, F, h, w), its last chunk, ended: its first latent frame
    decoded in ``stream`` (the rollout's), the last pixel frame re-encoded, and the slot's cache
    restarted with the overlap committed at frames 0 .. F-1 under ``text``.

    Returns the overlap (C, F, h, w), to be decoded in the returned fresh stream, and the pixel
    frames (3, H, W, 3) uint8 that go out before it; ``stream`` is disposed."""
    pixels = decoder.decode_batch_float([stream], chunk[None, :, :1])[0].clamp(-1.0, 1.0)  # (3, 4, H, W)
    first = decoder.encode_video(pixels[:, -1:])  # (C, 1, h, w), encoded as a video's first frame
    overlap = torch.cat((first.to(chunk.device, chunk.dtype), chunk[:, 1:]), 1)  # (C, F, h, w)
    stream.dispose()
    cache.reset(slot)
    model.commit(overlap[None], text, cache.chunk([slot], num_frames=overlap.shape[1]))
    return overlap, to_uint8_frames(pixels[:, :-1]), decoder.open()
