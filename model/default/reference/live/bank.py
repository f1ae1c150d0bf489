"""The live state's bank (``weights/live_bank.npz``, built by ``training/live_bank.py`` from
training worlds): what the live state samples what moves from. Read-only once loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

BANK = Path(__file__).resolve().parents[2] / "weights" / "live_bank.npz"
SNIPPET = 96  # frames of a trajectory snippet
FIELD_UNITS = 1  # world units per texel of a cloud or fog field
FIELD_PERIOD = 256  # world units after which the weather fields repeat
KIND_NAMES = ("animal", "boat")  # in the order of channels.ANIMAL, channels.BOAT


@dataclass(frozen=True, slots=True, eq=False)
class LiveBank:
    code_land: np.ndarray  # (codes,) float32: share of a code's units where an animal may stand
    code_water: np.ndarray  # (codes,) float32: where a boat may float
    herd_rate: float  # herds per unit² of land
    boat_rate: float  # boats per unit² of water
    herd_sizes: np.ndarray  # (H,) int16: a sample of herd sizes
    herd_spread: float  # world units: members around their herd's centre
    speed: tuple[np.ndarray, ...]  # per kind (S, SNIPPET) float32: speed, units a frame
    turn: tuple[np.ndarray, ...]  # per kind (S, SNIPPET) float32: change of heading, radians a frame
    clouds: np.ndarray  # (F, P, P) uint8 cloud fields
    fog: np.ndarray  # (F, P, P) uint8 fog fields
    winds: np.ndarray  # (W, 2) float32 drift, units a frame (y, x)
    cloud_threshold: dict[str, float]  # per weather with cloud shadows
    cloud_soft: float
    fog_map: tuple[float, float, float, float]  # offset, gain, floor, ceiling

    @classmethod
    def load(cls, path: Path = BANK) -> LiveBank:
        with np.load(path) as z:
            d = {k: z[k] for k in z.files}
        return cls(
            code_land=d["code_land"], code_water=d["code_water"],
            herd_rate=float(d["herd_rate"]), boat_rate=float(d["boat_rate"]),
            herd_sizes=d["herd_sizes"], herd_spread=float(d["herd_spread"]),
            speed=tuple(d[f"{k}_speed"] for k in KIND_NAMES), turn=tuple(d[f"{k}_turn"] for k in KIND_NAMES),
            clouds=d["clouds"], fog=d["fog"], winds=d["winds"],
            cloud_threshold={str(w): float(t) for w, t in zip(d["cloud_weathers"], d["cloud_threshold"], strict=True)},
            cloud_soft=float(d["cloud_soft"]),
            fog_map=tuple(float(v) for v in d["fog_map"]),  # type: ignore[arg-type]
        )
