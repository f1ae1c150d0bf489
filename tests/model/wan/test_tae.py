"""TAEHV's decoder (``--vae tae``) streaming chunk by chunk: equal, frame for frame, to the
reference TAEHV module's decode of the whole video (the wrapper that the streamdiffusionv2 wheel
ships, a test dependency), whatever the chunks, batched or not; the file found in a download
and named with its publisher when missing; a Wan runner serving it."""

from __future__ import annotations

import shutil
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from tests.model.wan.tiny_dir import HEIGHT, WIDTH
from worldserve.model.wan.tae import TAE_FILE, TaeDecoder, build_decoder, find_tae
from worldserve.model.wan.vae_stream import pixel_frames_for

taehv = pytest.importorskip("models.wan.taehv_wrapper", reason="streamdiffusionv2 (test dependency) not installed")

H, W = 2, 3  # latents: 16 x 24 pixels


def random_reference_file(path: Path, seed: int = 0) -> Path:
    """A taew2_1.pth of the reference module's layout (encoder and decoder) with random weights
    of a trained model's scale."""
    torch.manual_seed(seed)
    with mock.patch.object(taehv.torch, "load", return_value={}), \
            mock.patch.object(taehv.TAEHV, "patch_tgrow_layers", lambda self, sd: sd), \
            mock.patch.object(taehv.TAEHV, "load_state_dict", lambda self, sd: None):
        fresh = taehv.TAEHV(checkpoint_path=str(path))
    with torch.no_grad():  # pixels spread over the range (6% clamped), each frame reaching chunks ahead
        for p in fresh.parameters():
            p.add_(0.03 * torch.randn_like(p))
        fresh.decoder[22].bias.fill_(0.5)
    torch.save(fresh.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def tae_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_reference_file(tmp_path_factory.mktemp("tae") / TAE_FILE)


@pytest.fixture(scope="module")
def reference(tae_file: Path) -> torch.nn.Module:
    return taehv.TAEHV(checkpoint_path=str(tae_file)).eval()  # the reference's own loading path


def whole(reference: torch.nn.Module, latents: torch.Tensor, parallel: bool) -> torch.Tensor:
    """The reference's decode of a whole video (1, C, n, h, w): (3, 1 + 4 (n - 1), H, W) in [-1, 1]
    (its first 3 frames dropped, as TAEHV's own decode_video does; [0, 1] mapped as the wrapper does)."""
    with torch.no_grad():
        v = reference.decode_video(latents.transpose(1, 2), parallel=parallel)[0]  # (4n, 3, H, W)
    return v[3:].mul(2).sub(1).clamp(-1, 1).transpose(0, 1)


def test_streaming_equals_the_reference_s_whole_decode_frame_for_frame(tae_file, reference):
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 10, H, W, generator=g)
    want = whole(reference, latents, parallel=True)
    torch.testing.assert_close(whole(reference, latents, parallel=False), want, atol=1e-5, rtol=1e-5)
    dec = TaeDecoder.load(tae_file)
    for chunks in ((3, 3, 3, 1), (1, 2, 3, 4), (10,)):
        s, got, at = dec.open(), [], 0
        for n in chunks:
            v = dec.decode_batch_float([s], latents[:, :, at:at + n])[0]
            assert v.shape[1] == pixel_frames_for(at, n)
            got.append(v)
            at += n
        assert s.latent_frames == 10 and s.pixel_frames == 37
        torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-5, rtol=1e-5)
    frames = dec.decode(dec.open(), latents[0, :, :3])
    assert frames.shape == (9, 8 * H, 8 * W, 3) and frames.dtype == torch.uint8


def test_streams_of_any_phase_batch_as_they_decode_alone(tae_file):
    dec = TaeDecoder.load(tae_file)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(1, 16, 6, H, W, generator=g), torch.randn(1, 16, 3, H, W, generator=g)
    alone_a, alone_b = dec.open(), dec.open()
    dec.decode_batch_float([alone_a], a[:, :, :3])
    want_a = dec.decode_batch_float([alone_a], a[:, :, 3:])[0]
    want_b = dec.decode_batch_float([alone_b], b)[0]
    sa, sb = dec.open(), dec.open()
    dec.decode_batch_float([sa], a[:, :, :3])
    got_a, got_b = dec.decode_batch_float([sa, sb], torch.cat([a[:, :, 3:], b]))  # steady beside fresh
    assert got_a.shape[1] == 12 and got_b.shape[1] == 9
    torch.testing.assert_close(got_a, want_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_b, want_b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="encoding needs the full VAE"):
        dec.encode_video(torch.zeros(3, 1, 8, 8))


def test_the_file_is_found_in_a_download_and_named_with_its_publisher_when_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"taew2_1\.pth .*--vae tae.* madebyollin/taehv"):
        find_tae(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / TAE_FILE).write_bytes(b"")
    assert find_tae(tmp_path) == tmp_path / "checkpoints" / TAE_FILE
    with pytest.raises(FileNotFoundError, match=r"taew2_1\.pth does not exist; .*madebyollin/taehv"):
        TaeDecoder.load(tmp_path / "elsewhere" / TAE_FILE)


def tiny_tae(root: Path, z_dim: int, seed: int = 0) -> Path:
    """A TAEHV decoder file at a tiny width for the tiny runner's latents."""
    torch.manual_seed(seed)
    net = build_decoder(z_dim, (8, 8, 4, 4))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.save({f"decoder.{k}": v for k, v in net.state_dict().items()}, root / TAE_FILE)
    return root / TAE_FILE


def test_a_wan_runner_serves_tae_frames(wan_dir, tmp_path):
    from worldserve.model.wan.runner import WanRunner
    from worldserve.session.plan import Batch, ChunkWork, SessionSpec, StepPlan

    root = Path(shutil.copytree(wan_dir, tmp_path / "w"))
    tiny_tae(root, z_dim=4)
    runner = WanRunner.from_dir(root, sizes=((HEIGHT, WIDTH),), max_sessions=2, vae="tae")
    assert isinstance(runner.decoder, TaeDecoder)
    out = runner.execute(StepPlan(new_sessions=[SessionSpec("s", HEIGHT, 3, "a lake")]))
    assert not out.errors, out.errors
    shapes = []
    for block in range(2):
        out = runner.execute(StepPlan(batches=[Batch(HEIGHT, runner.max_steps, [ChunkWork("s", block, None)])]))
        assert not out.errors, out.errors
        shapes.append(out.results[0].frames.shape)
        assert out.results[0].frames.dtype == np.uint8 and out.results[0].frames.std() > 0
    assert shapes == [(runner.first_chunk_frames, HEIGHT, WIDTH, 3), (runner.frames_per_chunk, HEIGHT, WIDTH, 3)]
    with pytest.raises(FileNotFoundError, match=r"taew2_1\.pth"):
        (root / TAE_FILE).unlink()
        WanRunner.from_dir(root, sizes=((HEIGHT, WIDTH),), max_sessions=2, vae="tae")
