import numpy as np

from bench.quality import pooled_psnr, psnr


def test_pooled_psnr_is_the_psnr_of_the_mean_error() -> None:
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 256, (3, 8, 8, 3)).astype(np.uint8)
    pred = np.clip(truth.astype(np.int16) + rng.integers(-20, 21, truth.shape), 0, 255).astype(np.uint8)
    err = np.mean((pred.astype(np.float64) - truth) ** 2)
    assert abs(pooled_psnr(pred, truth) - 10 * np.log10(255.0**2 / err)) < 1e-9
    assert abs(pooled_psnr(pred[:1], truth[:1]) - psnr(pred[0], truth[0])) < 1e-9


def test_one_identical_episode_does_not_outweigh_the_rest() -> None:
    rng = np.random.default_rng(1)
    truth = rng.integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    pred = truth.copy()
    pred[1:] = 255 - truth[1:]  # three episodes badly wrong, one exact
    per_episode_mean = np.mean([psnr(p, t) for p, t in zip(pred, truth, strict=True)])
    assert per_episode_mean > 35  # the exact pair's +148 dB drags the dB mean up
    assert pooled_psnr(pred, truth) < 10
