"""The canvas prior's bank (training/ground_bank.py): code maps per look and season, a look's
seasons drawn from one world, and a rebuild of some seasons keeping the others."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worldserve.model.default.reference.canvas.quilt import GroundBank, bank_key
from worldserve.training.ground_bank import main
from worldserve.world.scene import ATTRIBUTES, SceneAttrs


def test_a_rebuild_of_some_seasons_keeps_the_others_and_covers_every_look(tmp_path: Path) -> None:
    out = tmp_path / "bank.npz"
    summer = np.full((1, 16 + 4, 16 + 4), 7, np.uint16)
    GroundBank({bank_key(SceneAttrs()): summer}).save(out)
    main(["--map-size", "256", "--seasons", "spring", "autumn", "--out", str(out)])
    bank = GroundBank.load(out)
    assert np.array_equal(bank.maps[bank_key(SceneAttrs())], summer)  # kept as it was
    looks = len(ATTRIBUTES["biome"]) * len(ATTRIBUTES["vegetation"]) * len(ATTRIBUTES["weather"])
    assert len(bank.maps) == 1 + 2 * looks
    for season in ("spring", "autumn"):
        m = bank.maps[bank_key(SceneAttrs(biome="snow", vegetation="dense", season=season))]
        assert m.shape == (1, 64, 64) and m.dtype == np.uint16
    # one world in both seasons: the same land, its canopy's codes changed with the leaves
    spring, autumn = (bank.maps[bank_key(SceneAttrs(vegetation="dense", season=s))] for s in ("spring", "autumn"))
    desert = [bank.maps[bank_key(SceneAttrs(biome="desert", vegetation="sparse", season=s))]
              for s in ("spring", "autumn")]
    assert (spring != autumn).mean() > (desert[0] != desert[1]).mean()


def test_a_map_is_encoded_in_the_codes_a_view_gets_there() -> None:
    """The bank's codes are those an observation of the same ground gets (a 64-pixel view
    through the tokenizer's encoder), not those of the whole map encoded at once, which the
    encoder's norms would read against the map's own hills and seas."""
    import torch

    from worldserve.model.default.reference.canvas.canvas import CODE_UNITS
    from worldserve.model.default.reference.canvas.tokenizer import WEIGHTS, load_tokenizer
    from worldserve.training.ground_bank import KEEP, MARGIN, VIEW, code_map, ground_raster
    from worldserve.world import World

    tok = load_tokenizer(WEIGHTS)
    world = World(3, SceneAttrs(biome="grassland", vegetation="dense"), (VIEW,), map_size=256)
    codes = code_map(tok, world, 256)
    assert codes.shape == (64, 64) and codes.dtype == np.uint16
    x = torch.from_numpy(ground_raster(world, 256)).permute(2, 0, 1)[None].float() / 127.5 - 1
    pad, k = (VIEW - KEEP) // 2, KEEP // CODE_UNITS
    with torch.inference_mode():
        for y, x0 in ((0, 0), (96, 32), (224, 192)):  # map units, on the KEEP grid (the last at the torus's end)
            view = x[:, :, MARGIN + y - pad : MARGIN + y - pad + VIEW, MARGIN + x0 - pad : MARGIN + x0 - pad + VIEW]
            c0 = pad // CODE_UNITS
            mid = tok.encode(view)[0, c0 : c0 + k, c0 : c0 + k]
            cy, cx = y // CODE_UNITS, x0 // CODE_UNITS
            assert np.array_equal(codes[cy : cy + k, cx : cx + k], mid.numpy())
        lo, hi = MARGIN // CODE_UNITS, (MARGIN + 256) // CODE_UNITS
        whole = tok.encode(x)[0, lo:hi, lo:hi]
    assert (whole.numpy() == codes).mean() < 0.8  # the whole map at once speaks otherwise
