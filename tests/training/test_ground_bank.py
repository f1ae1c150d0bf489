"""The canvas prior's bank (training/ground_bank.py): code maps per look and season, a look's
seasons drawn from one world, and a rebuild of some seasons keeping the others."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worldserve.model.default.quilt import GroundBank, bank_key
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
    desert = [bank.maps[bank_key(SceneAttrs(biome="desert", vegetation="sparse", season=s))] for s in ("spring", "autumn")]
    assert (spring != autumn).mean() > (desert[0] != desert[1]).mean()
