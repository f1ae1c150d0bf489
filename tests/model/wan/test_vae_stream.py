"""The streaming Wan2.1 VAE decoder at a tiny random size: chunk by chunk equals the whole video."""

from __future__ import annotations

import re

import pytest
import torch
from diffusers import AutoencoderKLWan

from worldserve.model.wan.vae_stream import (
    VAE_WEIGHTS_FILE,
    StreamingDecoder,
    feature_cache_bytes,
    load_vae,
    pixel_frames_for,
    to_uint8_frames,
)

# Wan2.1's layout (4 stages, 2 res blocks, time upsampling in the last two) at base width 4.
TINY = {
    "base_dim": 4,
    "z_dim": 4,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "temperal_downsample": [False, True, True],
    "latents_mean": [0.3, -0.5, 0.1, 0.8],
    "latents_std": [1.5, 0.7, 2.0, 1.2],
}
H, W = 4, 6  # latent size: 32x48 pixels


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLWan:
    torch.manual_seed(0)
    return AutoencoderKLWan(**TINY).eval()


def latents(frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, TINY["z_dim"], frames, H, W, generator=g)  # (1, C, F, h, w) normalised


def whole_video(vae: AutoencoderKLWan, z: torch.Tensor) -> torch.Tensor:
    """diffusers' own decode of the whole latent video: (3, F', H, W) in [-1, 1]."""
    mean = torch.tensor(TINY["latents_mean"]).view(1, -1, 1, 1, 1)
    std = torch.tensor(TINY["latents_std"]).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        return vae.decode(z * std + mean).sample[0]


def stream_chunks(dec: StreamingDecoder, z: torch.Tensor, chunk: int = 3) -> list[torch.Tensor]:
    s = dec.open()
    return [dec.decode_batch_float([s], z[:, :, i : i + chunk])[0] for i in range(0, z.shape[2], chunk)]


def test_streaming_decode_chunk_by_chunk_equals_whole_video_decode(vae):
    dec = StreamingDecoder(vae)
    z = latents(9, seed=1)
    streamed = torch.cat(stream_chunks(dec, z), dim=1)
    full = whole_video(vae, z)
    assert streamed.shape == full.shape == (3, 33, 8 * H, 8 * W)
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=0)


def test_first_chunk_decodes_to_9_frames_and_later_chunks_to_12(vae):
    dec = StreamingDecoder(vae)
    s = dec.open()
    z = latents(12, seed=2)
    counts = [dec.decode(s, z[:, :, i : i + 3]).shape[0] for i in range(0, 12, 3)]
    assert counts == [9, 12, 12, 12]
    assert (s.latent_frames, s.pixel_frames) == (12, 45)
    assert [pixel_frames_for(0, 3), pixel_frames_for(3, 3),
            pixel_frames_for(0, 1), pixel_frames_for(1, 2)] == [9, 12, 1, 8]


def test_uint8_frames_are_height_width_channels(vae):
    dec = StreamingDecoder(vae)
    s = dec.open()
    frames = dec.decode(s, latents(3, seed=3)[0])  # (C, F, h, w) without a batch axis
    assert frames.dtype == torch.uint8 and frames.shape == (9, 8 * H, 8 * W, 3)
    ref = to_uint8_frames(whole_video(vae, latents(3, seed=3)))
    assert (frames.int() - ref.int()).abs().max() <= 1


def test_interleaved_sessions_on_one_decoder_give_each_session_its_own_frames(vae):
    dec = StreamingDecoder(vae)
    za, zb = latents(9, seed=4), latents(9, seed=5)
    alone_a, alone_b = stream_chunks(dec, za), stream_chunks(dec, zb)
    a, b = dec.open(), dec.open()
    for i in range(3):
        got_a = dec.decode_batch_float([a], za[:, :, 3 * i : 3 * i + 3])[0]
        got_b = dec.decode_batch_float([b], zb[:, :, 3 * i : 3 * i + 3])[0]
        torch.testing.assert_close(got_a, alone_a[i], atol=0, rtol=0)
        torch.testing.assert_close(got_b, alone_b[i], atol=0, rtol=0)


def test_batched_sessions_in_different_phases_match_each_decoded_alone(vae):
    dec = StreamingDecoder(vae)
    za, zb, zc = latents(6, seed=6), latents(6, seed=7), latents(3, seed=8)
    alone_a, alone_b, alone_c = stream_chunks(dec, za), stream_chunks(dec, zb), stream_chunks(dec, zc)
    a, b, c = dec.open(), dec.open(), dec.open()
    first = dec.decode_batch_float([a, b], torch.cat([za[:, :, :3], zb[:, :, :3]]))
    # a and b are steady now, c is fresh: one batch holds both phases.
    second = dec.decode_batch_float([a, c, b], torch.cat([za[:, :, 3:], zc, zb[:, :, 3:]]))
    for got, want in zip([*first, *second], [alone_a[0], alone_b[0], alone_a[1], alone_c[0], alone_b[1]], strict=True):
        assert got.shape == want.shape
        # Batched convolutions sum in another order: equal up to float rounding.
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert [s.pixel_frames for s in (a, b, c)] == [21, 21, 9]


def test_batched_streams_hold_their_own_cache_memory(vae):
    dec = StreamingDecoder(vae)
    a, b = dec.open(), dec.open()
    dec.decode_batch([a, b], torch.cat([latents(3, seed=15), latents(3, seed=16)]))

    def storages(s):
        return {e.untyped_storage().data_ptr() for e in s.feat_cache if isinstance(e, torch.Tensor)}

    assert storages(a) and storages(a).isdisjoint(storages(b))
    assert a.cache_bytes == b.cache_bytes == feature_cache_bytes(TINY, 8 * H, 8 * W, dtype=torch.float32)


def test_decoder_loads_from_a_saved_local_directory(vae, tmp_path):
    vae.save_pretrained(tmp_path / "vae")
    loaded = StreamingDecoder.load(tmp_path / "vae")
    z = latents(3, seed=9)
    want = StreamingDecoder(vae).decode_batch_float([StreamingDecoder(vae).open()], z)[0]
    got = loaded.decode_batch_float([loaded.open()], z)[0]
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_missing_vae_weights_file_is_an_error_naming_it(vae, tmp_path):
    vae.save_pretrained(tmp_path / "vae")
    (tmp_path / "vae" / VAE_WEIGHTS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(VAE_WEIGHTS_FILE)):
        load_vae(tmp_path / "vae")
    with pytest.raises(FileNotFoundError, match=r"Wan2\.1_VAE\.pth"):
        load_vae(tmp_path / "Wan2.1_VAE.pth")


def test_authors_pth_with_original_key_names_decodes_as_their_vae(tmp_path):
    ref = pytest.importorskip("models.wan.wan_base.modules.vae")  # the reference package, tests only
    torch.manual_seed(1)
    theirs = ref.WanVAE_(dim=4, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                         temperal_downsample=[False, True, True]).eval()
    torch.save(theirs.state_dict(), tmp_path / "Wan2.1_VAE.pth")
    dec = StreamingDecoder.load(tmp_path / "Wan2.1_VAE.pth", config=TINY)
    z = latents(6, seed=10)
    mean, std = torch.tensor(TINY["latents_mean"]), torch.tensor(TINY["latents_std"])
    with torch.no_grad():
        want = theirs.decode(z, [mean, 1.0 / std]).clamp(-1, 1)[0]  # their scale: z / (1/std) + mean
    got = torch.cat(stream_chunks(dec, z), dim=1)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)  # two implementations: float rounding


def test_bad_pth_names_the_file_and_the_keys(tmp_path):
    torch.save({"decoder.bogus.weight": torch.zeros(1)}, tmp_path / "vae.pth")
    with pytest.raises(ValueError, match=r"vae\.pth.*missing keys"):
        load_vae(tmp_path / "vae.pth", config=TINY)


def test_encode_frames_gives_normalised_posterior_means(vae):
    dec = StreamingDecoder(vae)
    g = torch.Generator().manual_seed(11)
    frames = torch.randint(0, 256, (5, 8 * H, 8 * W, 3), dtype=torch.uint8, generator=g)
    z = dec.encode_frames(frames)
    assert z.shape == (TINY["z_dim"], 2, H, W)
    x = frames.permute(3, 0, 1, 2).unsqueeze(0).float() / 127.5 - 1.0
    with torch.no_grad():
        mu = vae.encode(x).latent_dist.mode()[0]
    mean = torch.tensor(TINY["latents_mean"]).view(-1, 1, 1, 1)
    std = torch.tensor(TINY["latents_std"]).view(-1, 1, 1, 1)
    torch.testing.assert_close(z * std + mean, mu, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="1 \\+ 4k frames, got 4"):
        dec.encode_frames(frames[:4])


def test_feature_cache_size_computed_on_meta_matches_a_real_stream(vae):
    dec = StreamingDecoder(vae)
    s = dec.open()
    dec.decode(s, latents(3, seed=12))
    assert s.cache_bytes == feature_cache_bytes(TINY, 8 * H, 8 * W, dtype=torch.float32)


def test_bad_chunks_are_refused_with_the_shapes(vae):
    dec = StreamingDecoder(vae)
    s = dec.open()
    dec.decode(s, latents(3, seed=13))
    with pytest.raises(ValueError, match=r"latents of \(4, 6\), got a chunk of \(2, 6\)"):
        dec.decode(s, torch.zeros(1, 4, 3, 2, 6))
    with pytest.raises(ValueError, match="C=4"):
        dec.decode(s, torch.zeros(1, 8, 3, 4, 6))
    s.dispose()
    with pytest.raises(ValueError, match="disposed"):
        dec.decode(s, latents(3, seed=14))
